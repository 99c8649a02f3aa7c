"""Storage: the protocols every backend implements, the backends, and opening one by URL."""
