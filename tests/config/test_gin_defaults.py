"""One default per setting: a gin file binds only what differs from the Python default.

Every gin file under ``gin/`` is read statement by statement (gin's own parser, so each
binding keeps its file and line), each ``Class.param`` (or ``scope/Class.param``) is
resolved through gin's registry after importing every configurable module
(``gin_setup.register``), and a binding whose value equals the default of that parameter in
the configurable's signature fails the test, named ``file:line``.

A binding equal to the default is kept only where it undoes an earlier binding of the same
parameter: one made by an included file, or by a file listed before it in one of the
combinations the project runs (``USES``: a model-group file, then a deployment file, with or
without a backend or model-group option file before or after it). Every model-group file
includes ``gin/deployments/pivotrl.gin`` as its default deployment, so e.g.
``Deployment.training_home = True`` in ``disaggregated.gin`` is needed.

What cannot be compared is skipped, not failed:

- macro definitions (``DISAGG_ROLLOUT = 2``: no configurable) and values that are macros
  (``%DISAGG_ROLLOUT``: bound per model group);
- evaluated references (``@PromptStream()``: the object is built with its own bindings at
  call time; a default instance built at import time is not the same setting);
- parameters whose default is ``gin.REQUIRED`` or that have none (nothing to repeat), and
  parameters a configurable takes through ``**kwargs`` (no signature entry).

An unevaluated reference (``@NoShiftPlanner``) is compared by identity with the default.
A scoped binding is compared with the unscoped default (a scope selects which call gets
the value, not another default); it undoes an earlier binding of its own scope or an
unscoped one. ``True`` and ``1`` are different values here (gin keeps the type).
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from pathlib import Path

import gin
import pytest
from gin import config as gin_config
from gin import config_parser

from pivot import gin_setup

ROOT = Path(__file__).resolve().parents[2]
GIN = ROOT / "gin"


@dataclass(frozen=True)
class Ref:
    name: str
    evaluate: bool


@dataclass(frozen=True)
class Macro:
    name: str


class _Delegate(config_parser.ParserDelegate):
    def configurable_reference(self, scoped_configurable_name, evaluate):
        return Ref(scoped_configurable_name, evaluate)

    def macro(self, macro_name):
        return Macro(macro_name)


@dataclass(frozen=True)
class Binding:
    file: str
    line: int
    scope: str
    selector: str   # the configurable's full selector, e.g. pivot.spec.deployment.Deployment
    param: str
    value: object
    default: object  # inspect.Parameter.empty where there is nothing to compare with

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def text(self) -> str:
        scope = f"{self.scope}/" if self.scope else ""
        return f"{scope}{self.selector.rsplit('.', 1)[-1]}.{self.param}"


NOTHING = inspect.Parameter.empty


def _default(selector: str, param: str) -> tuple[str, object]:
    """The configurable's full selector and the default of ``param`` (NOTHING if it has
    none, is required or is not in the signature)."""
    found = gin_config._REGISTRY.get_match(selector)
    if found is None:
        raise AssertionError(f"{selector} is not a registered configurable")
    try:
        p = inspect.signature(found.wrapped).parameters.get(param)
    except (TypeError, ValueError):
        return found.selector, NOTHING
    if p is None or p.default is inspect.Parameter.empty or p.default is gin.REQUIRED:
        return found.selector, NOTHING
    return found.selector, p.default


def _comparable(value: object) -> bool:
    if isinstance(value, Macro) or (isinstance(value, Ref) and value.evaluate):
        return False
    if isinstance(value, (list, tuple)):
        return all(_comparable(v) for v in value)
    if isinstance(value, dict):
        return all(_comparable(v) for v in value.values())
    return True


def same(value: object, default: object) -> bool:
    """Whether a parsed gin value is the default (module docstring for what counts)."""
    if default is NOTHING or not _comparable(value):
        return False
    if isinstance(value, Ref):
        found = gin_config._REGISTRY.get_match(value.name.rsplit("/", 1)[-1])
        return found is not None and default in (found.wrapped, found.wrapper)
    if isinstance(value, bool) or isinstance(default, bool):
        return type(value) is type(default) and value == default
    if isinstance(value, (list, tuple)):
        return (isinstance(default, (list, tuple)) and type(value) is type(default)
                and len(value) == len(default)
                and all(same(v, d) for v, d in zip(value, default)))
    if isinstance(value, (int, float)) and isinstance(default, (int, float)):
        return value == default
    try:
        return type(value) is type(default) and bool(value == default)
    except Exception:  # noqa: BLE001  (an object without a usable ==)
        return False


@functools.lru_cache(maxsize=None)
def statements(path: str) -> tuple:
    """The file's statements: Binding, or ("include", path) in place."""
    p = Path(path).resolve()
    rel = str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)
    out = []
    text = Path(path).read_text()
    for st in config_parser.ConfigParser(text, _Delegate()):
        line = st.location.line_num
        if isinstance(st, config_parser.IncludeStatement):
            out.append(("include", str(ROOT / st.filename)))
        elif isinstance(st, config_parser.BindingStatement) and st.arg_name:
            selector, default = _default(st.selector, st.arg_name)
            out.append(Binding(rel, line, st.scope, selector, st.arg_name, st.value,
                               default))
    return tuple(out)


def walk(files: list[str], seen: tuple[str, ...] = ()):
    """Bindings of ``files`` in the order gin applies them (includes in place)."""
    for f in files:
        if f in seen:
            continue
        for st in statements(f):
            if isinstance(st, Binding):
                yield st
            else:
                yield from walk([st[1]], seen + (f,))


def _files(pattern: str) -> list[str]:
    return sorted(str(p) for p in GIN.glob(pattern))


def uses() -> list[list[str]]:
    """The combinations the project runs (module docstring): every file alone, every
    model group with every deployment, and with an option file before or after it."""
    groups = [f for f in _files("*.gin") if not f.endswith(("base.gin", "_tp2.gin"))]
    groups += _files("calibration/verl_dapo7b.gin")
    deployments = _files("deployments/*.gin")
    options = (_files("backends/*.gin") + _files("*_tp2.gin")
               + _files("calibration/*_fitted.gin"))
    out = [[f] for f in _files("**/*.gin")]
    for g in groups:
        for d in deployments:
            out.append([g, d])
            for o in options:
                out += [[g, d, o], [g, o, d]]
    return out


def repeats(use_list: list[list[str]] | None = None) -> list[Binding]:
    """Bindings equal to their default that undo nothing in any use."""
    use_list = uses() if use_list is None else use_list
    candidates: dict[tuple[str, int], Binding] = {}
    needed: set[tuple[str, int]] = set()
    for files in use_list:
        bound: dict[tuple[str, str, str], object] = {}
        for b in walk(files):
            key = (b.scope, b.selector, b.param)
            if same(b.value, b.default):
                candidates[(b.file, b.line)] = b
                earlier = [bound[k] for k in (key, ("", b.selector, b.param)) if k in bound]
                if any(not same(v, b.default) for v in earlier):
                    needed.add((b.file, b.line))
            bound[key] = b.value
    return sorted((b for k, b in candidates.items() if k not in needed),
                  key=lambda b: (b.file, b.line))


@pytest.fixture(scope="module", autouse=True)
def registry():
    gin_setup.register()


def test_no_gin_binding_repeats_the_python_default():
    found = repeats()
    assert not found, (f"{len(found)} gin binding(s) repeat the Python default of their "
                       "parameter (delete the line; move its comment to the parameter's "
                       "docstring):\n" + "\n".join(
                           f"  {b.where}: {b.text} = {b.value!r}" for b in found))


def test_every_gin_file_and_binding_is_read():
    """The walk sees every file and every ``Class.param`` line of it (macro definitions
    and includes aside)."""
    import re
    line = re.compile(r"^\s*[\w./]+\.\w+\s*=")
    files = _files("**/*.gin")
    assert "gin/tiny_cpu.gin" in {str(Path(f).relative_to(ROOT)) for f in files}
    for f in files:
        want = sum(bool(line.match(x)) for x in Path(f).read_text().splitlines())
        assert sum(isinstance(s, Binding) for s in statements(f)) == want, f


def test_the_checker_names_repeats_and_keeps_undoing_bindings(tmp_path):
    base = tmp_path / "base.gin"
    base.write_text("Deployment.staleness = 0\nPivotPlanner.H = 30.0\n"
                    "policy/ModelProfile.prefill_mfu = 0.9\nM = 3\n")
    over = tmp_path / "over.gin"
    over.write_text(
        "Deployment.staleness = 2\n"          # undoes base's 0: kept
        "Deployment.reward_devices = 0\n"     # the default, undoes nothing: a repeat
        "Deployment.rollout_devices = %M\n"   # a macro: not compared
        "Deployment.planner = @NoShiftPlanner\n"  # no default: not compared
        "PivotPlanner.H = 60.0\n"             # undoes base's 30: kept
        "PivotPlanner.migrate = True\n"       # a repeat
        "PivotPlanner.min_replicas = False\n"  # a bool for an int default of 0: differs
        "policy/ModelProfile.prefill_mfu = 0.5\n"  # scoped, undoes base's 0.9: kept
        "genrm/ModelProfile.prefill_mfu = 0.5\n"   # scoped, the default: a repeat
        "ClusterDriver.stack = None\n")       # a repeat of None
    found = repeats([[str(base), str(over)]])
    lines = {b.line for b in found if b.file.endswith("over.gin")}
    assert lines == {2, 6, 9, 10}, [(b.where, b.text) for b in found]
