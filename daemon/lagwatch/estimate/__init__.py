"""The estimate stage of a cycle (read, estimate, act, serve): what the readings mean, with
no I/O and the clock passed in. ``dating`` is the one rule that dates a reading's age;
the LSN clock it reads is lsnclock.LsnClock, the windows windows.py.
"""
