"""Register this checkout's entry points (SGLang's plugin group) in a --target site folder.

    python3 -m bench.gpu.entry_points SITE

The device machine installs wheels with `pip install --target`; the checkout itself is not built, so
SGLang's `load_plugins()` would not see `sglang.srt.plugins`. This writes only METADATA and
entry_points.txt from pyproject.toml: the code keeps loading from the checkout on PYTHONPATH."""

import pathlib
import sys
import tomllib

project = tomllib.loads(pathlib.Path("pyproject.toml").read_text())["project"]
info = pathlib.Path(sys.argv[1]) / f"sglang_jetspec-{project['version']}.dist-info"
info.mkdir(parents=True, exist_ok=True)
(info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
(info / "entry_points.txt").write_text(
    "".join(
        f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in points.items())
        for group, points in project["entry-points"].items()
    )
)
