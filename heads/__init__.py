"""What training and serving share, and nothing else: the model-package contract (contract.py),
text -> model rows in each family's layout (rows.py), the package format (package.py), and
each head's pre- and post-processing (tasks/). Imports numpy and tokenizers only, so that the
service never loads torch and training never loads the service (tests/test_layering.py).
"""
