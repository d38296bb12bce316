"""Offline batch inference: a file in, Parquet out, through the same engine as the HTTP server
(service.engine), so the answers are the endpoints' (`python -m service.batch --help`).

    read.py      Parquet / JSON Lines / CSV read part by part, bad records named by row
    tasks.py     per task: the columns it reads, the engine call, the Arrow type of its answer
    answer.py    a window of rows sorted by length, answered in chunks, bad rows isolated
    output.py    numbered Parquet parts, the errors file, what makes a resumed run the same
    run.py       the single-process run: read, answer and write overlap, two parts in memory
    ray_stage.py the engine as a Ray Data stage (`Predictor`) and the `--ray` run
    flags.py     command-line values as the endpoint's body field types; their --help lines
    progress.py  the progress line
"""
