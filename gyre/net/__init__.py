"""Loopback HTTP plumbing shared by every in-process server (the model-call proxy, the
package-index proxy, a Ray rank's engine server): `server_thread.py` serves an ASGI app with
uvicorn from a background thread. It sits below all of them and imports nothing of gyre's.
"""
