"""The default torch threads per replica: cores not busy with other work, split over the replicas."""

import pytest

from diloco.train.threads import busy_cores, default_threads, usable_cores


@pytest.mark.parametrize(
    "cores, busy, replicas, expected",
    [
        (2, 0.0, 1, 2),
        (2, 0.0, 2, 1),  # idle: cores // replicas, the old default
        (2, 0.4, 1, 2),
        (2, 0.6, 1, 1),  # under half a core busy is noise; more is a busy core
        (2, 1.0, 1, 1),
        (2, 2.0, 1, 1),
        (2, 3.5, 2, 1),  # never below one thread
        (16, 3.2, 2, 6),
        (16, 0.0, 3, 5),
    ],
)
def test_default_threads_counts_free_cores(cores, busy, replicas, expected):
    assert default_threads(replicas, cores=cores, busy=busy) == expected


def test_busy_cores_is_measured_within_the_affinity():
    cpus = usable_cores()
    assert cpus and 0.0 <= busy_cores(cpus, window_s=0.05) <= len(cpus)
    with pytest.raises(ValueError, match="replicas=0"):
        default_threads(0)
