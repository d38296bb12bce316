"""The stages of a model's worker (service.batcher), each a module with one job:

- service.job_queue: the queue policy (admission, deadlines, dropped requests, which rows form
  the next batch: `grow_batch`);
- `encode`: texts -> model rows (the tokenizer, then each job's `rows`), and the rows handed
  to the queue;
- `infer`: a batch run in a lane's thread (pad, the backend, each row's slice of the outputs),
  and the pocket that hands a lane's thread its next batch;
- `answer`: the answers of the requests a batch completed, and their futures set.

The worker (service.batcher.Batcher) owns the state between them: what is being encoded, the
lanes running, and when each stage runs.
"""
