buffers = 2  # each worker holds its own buffer: memory grows with the workers
more_chunks_per_batch = False  # a batch comes from one worker's buffer, which sees only that worker's share
