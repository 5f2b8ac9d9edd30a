"""Where the clusters come from, and when that changes.

In: the config file, its clusters_dir (one YAML file per cluster), Patroni's REST API.
Out: the clusters in force each cycle (clusters.py: ClusterSources), each with its members
and the errors that kept a file or a discovery out.
"""
