"""This process's memory, as the system sees it: what it could still get, and freed memory
handed back."""
from __future__ import annotations


def memory_available() -> int | None:
    """Bytes of memory the system could give this process now (Linux ``MemAvailable``: free
    memory plus what the page cache would hand back); None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def release_freed_memory() -> None:
    """Give freed heap memory back to the OS. glibc keeps the freed blocks of large temporaries
    (float32 blends, a forward pass's activations) in its arenas, where they count as the
    process's resident memory until trimmed; elsewhere nothing to do."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
