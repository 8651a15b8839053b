policy = RetryPolicy(timeout_s=0.5, retries=2, backoff_s=0.1)
# every attempt waits its whole timeout; between attempt k + 1 and k + 2 the reader waits backoff_s x 2**k
seconds = (policy.retries + 1) * policy.timeout_s + sum(policy.backoff_s * 2**k for k in range(policy.retries))
