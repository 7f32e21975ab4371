"""Cells and the elastic scheduler.

The scheduler is pure logic (events in, commands out, injected clock): `scheduler.py`
drives one of the policies in `registry.py` over the books kept in `state.py`. Nothing
in this package's scheduler modules starts a thread, sleeps or does I/O.
"""
