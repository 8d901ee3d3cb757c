"""Model KV-cache layouts and the kernels that consume block tables.

Empty so far: the kernel stage arrives with its own issue.
"""
