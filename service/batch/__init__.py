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

import os

# Arrow's C++ code (the Parquet reader's and writer's own buffers) allocates from the pool that
# pyarrow picks once, on its import: the system allocator, set before any module here imports
# pyarrow (run.release_memory sets the pool of the Python calls). Arrow's default, mimalloc,
# held 56 -> 86 MiB resident over a 300,000-row run for at most 27 MiB allocated at once; the
# run's peak RSS 523 -> 477 MiB.
os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
