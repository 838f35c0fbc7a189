"""Loading a script of scripts/ as a module, so tests can call its `main(argv)` in-process."""
import importlib.util
import os
import sys

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts")


def load_script(name: str):
  # As when run: the script's folder is on sys.path (a script may import another's helpers).
  if SCRIPTS not in sys.path:
    sys.path.append(SCRIPTS)
  spec = importlib.util.spec_from_file_location(f"script_{name}",
                                                os.path.join(SCRIPTS, f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module
