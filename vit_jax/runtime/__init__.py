"""Process plumbing every command shares: the allocator, XLA:CPU kernel routing, the compilation
cache, quiet logs, start-up and exits, paths (local or cloud), config files, dispatch and the CPU's
features."""
