"""On PYTHONPATH in the environment of a warm job (tests/warm_python.py): a fresh `python ARGS` started there hands
itself to the warm server of its interpreter and environment, if there is one, and goes on as itself otherwise."""
import importlib.util
import os

if "WARM_PYTHON_SOCKETS" in os.environ:
    _spec = importlib.util.spec_from_file_location(
        "warm_python_client", os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "warm_python.py"))
    _client = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_client)
    _client.hand_over()
