"""libshift's ground floor: the names of ibverbs (enums, QP attributes and the Endpoint, work requests and
completions, errors), as plain values. It imports nothing else of libshift; the providers, device lookup and
the verbs objects (libshift.verbs) all speak it, and `from libshift.verbs import ...` re-exports it."""
