"""The compiled program as a value (compiled.py) and the Runner protocol with what every
backend shares (runner.py). Backends provide the runners: backends/reference_runner.py,
backends/c/host.py."""
