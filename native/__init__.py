"""C kernels of our own, for what torch has no fast CPU kernel for: each built once per machine at first use with
the system's C compiler, cached, and loaded through ctypes (build.py). The network (model/) calls a loaded
library it is handed and never builds or reads a file itself."""
