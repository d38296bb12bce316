"""One module per head, each in three steps: `encode_pre` (text -> model rows), the batcher
runs the rows, `encode_post` (model outputs -> answer).

Pre- and post-processing are plain functions over `tokenizers` encodings and numpy arrays
(rows and their outputs are `service.rows` types), so `training.evaluate` scores exactly what
the service answers.
"""
