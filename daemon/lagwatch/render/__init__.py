"""What lagwatch writes its outputs with, below the rooms that use it: the catalogue of
metric families (families.py), the Prometheus text they are written in (exposition.py) and
the HTML helpers of /status (html.py). No I/O, no snapshot.
"""
