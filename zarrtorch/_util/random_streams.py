"""The random streams drawn from a job's ``(seed, epoch)``, each under a tag of its own.

Every random choice of an epoch comes from NumPy's ``SeedSequence([seed, epoch, tag, ...])``: the same numbers in
every process of a job, and in a run that resumes it. Two choices under one tag would draw the same numbers
(correlated orders), so each has its own, named here once; changing one changes every epoch's batches (the plan's
fingerprint, :func:`zarrtorch.plan.plan_fingerprint`, samples them).
"""

CHUNK_ORDER = 0  # the epoch's chunk order (zarrtorch.order's network keys)
CACHED_PIECES = 1  # the order of a worker's pieces when the partition is kept in memory (keep_in_memory)
SHUFFLE_BUFFER = 2  # a worker's shuffle buffer: which rows leave it for each batch
MIX_ORDER = 3  # a MixedLoader's order of sources over an epoch's steps (zarrtorch.mix)
PLACED_PIECES = 4  # the order of the pieces of a rank's share kept for several epochs (redeal_every)
