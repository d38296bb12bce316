"""The quickstart's own models: what `make models` builds and `make serve` serves by default.

    data.py, qa_data.py   generated training data for the demo heads (templates and word lists)
    models.py             the default model repository: all-MiniLM-L6-v2 and three demo heads
                          fine-tuned from it (python -m demo.models)
    checks.py             the hand-written check set the demo heads are scored on

Product code for the quickstart, not training: it uses `training` to fine-tune and export, and
`heads` to score the packages as the service answers.
"""
