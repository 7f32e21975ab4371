"""What an evaluation runs in and with: its Python (`toolenv.py`, never gyre's own
site-packages), what a task's scripts need and whether this machine offers it (`needs.py`),
the copy of the kept workspace it scores (`workspace_copy.py`), and its share of the
execution's overall budget (`deadline.py`).
"""
