"""libshift: the verbs API that applications use, with SHIFT's failover beneath it."""

from libshift.grpc_polling import read_on_the_waiting_thread

__version__ = "0.1.0"
GRPC_READS_ON_THE_WAITING_THREAD = read_on_the_waiting_thread()
