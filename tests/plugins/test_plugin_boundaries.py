"""Plugins reach one another only through the hook spec, never by importing each other.

Every built-in provider and runtime package (plugins/*/levers9_*,
runtimes/*/levers9_*) is read as source: an import of another plugin's
package, or of the ``nvidia_smi`` discovery plugin's module, fails the test
with the file and line. Such an import would call a hook without the facade's
deadline and result check, or tie one plugin's release to another's; what two
plugins share lives in levers9 itself (``levers9.kube``, ``levers9.engine``,
``levers9.token_file``), and GPU discovery is asked through the plugin context
(``PluginContext.gpu_devices``).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = sorted(p for p in [*ROOT.glob("plugins/*/levers9_*"), *ROOT.glob("runtimes/*/levers9_*")] if p.is_dir())
#: plugins other plugins must not import; the built-in packages are added below
FORBIDDEN_MODULES = ("levers9.discovery.nvidia_smi",)


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def _crossings(package: Path, root: Path = ROOT) -> list[str]:
    others = tuple(p.name for p in PACKAGES if p.name != package.name) + FORBIDDEN_MODULES
    wrong = []
    for path in sorted(package.rglob("*.py")):
        for line, module in _imports(path):
            if any(module == other or module.startswith(other + ".") for other in others):
                wrong.append(f"{path.relative_to(root)}:{line}: imports {module}")
    return wrong


def test_the_built_in_plugins_are_all_read() -> None:
    names = {p.name for p in PACKAGES}
    assert {"levers9_local", "levers9_local_k8s", "levers9_attached_cluster", "levers9_runc", "levers9_criu"} <= names


def test_no_plugin_imports_another_plugin() -> None:
    wrong = [crossing for package in PACKAGES for crossing in _crossings(package)]
    assert not wrong, "plugins import other plugins (use the hooks or a levers9 module):\n" + "\n".join(wrong)


def test_the_check_finds_a_crossing(tmp_path: Path) -> None:
    """The test above can fail: a package importing another plugin, or the discovery module, is named."""
    package = tmp_path / "levers9_attached_cluster"
    package.mkdir()
    (package / "provider.py").write_text(
        "from levers9_local_k8s.jobs import job_manifest\n"
        "def hook():\n"
        "    from levers9.discovery.nvidia_smi import levers9_gpu_devices\n"
    )
    assert _crossings(package, tmp_path) == [
        "levers9_attached_cluster/provider.py:1: imports levers9_local_k8s.jobs",
        "levers9_attached_cluster/provider.py:1: imports levers9_local_k8s.jobs.job_manifest",
        "levers9_attached_cluster/provider.py:3: imports levers9.discovery.nvidia_smi",
        "levers9_attached_cluster/provider.py:3: imports levers9.discovery.nvidia_smi.levers9_gpu_devices",
    ]
