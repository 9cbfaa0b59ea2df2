"""Developer tools that drive a launched app or the engine beside it (soak, bench_app, served,
screenshot, devtools); nothing a visitor's request runs imports them."""
