"""The import graph of layerswap_core, app.py and its tabs (app_tabs/), read from the source with
``ast`` (module- and function-level imports alike): no cycle, every arrow points down the
declared layers, no import hidden behind ``importlib``, no command-line code in the library, and
no Gradio code in it either (the page is app.py and app_tabs/, beside the library)."""
from __future__ import annotations

import ast
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "layerswap_core"
# The Gradio page's tabs, one module each (app.py composes them): a package beside the library,
# its modules named in full ("app_tabs.models"), in the layers just below app.py
TABS_PACKAGE = "app_tabs"

# Bottom first. A module may import modules of its own layer (without a cycle) and of the layers
# below it, never above. Every module of the package (and app.py) is in exactly one layer.
LAYERS = [
    # the package root and the rooms' __init__ (docstrings, version, lazy API names: no static
    # imports), the architectures' tensor names, the per-tensor merge methods
    ("layerswap_core", "checkpoints", "merge", "analysis", "inference", "evaluation", "training",
     "demos", "engines", "sweeps", "workbench",
     "checkpoints.architectures", "checkpoints.kinds_table",   # the derived kinds' table
     "checkpoints.derive_kinds",                  # kinds from transformers' modules (run time)
     "checkpoints.quantized",                     # quantized checkpoints recognised (refused)
     "merge.methods", "merge.errors", "progress",
     "memory", "settings"),                       # the process's memory; numbers from variables
    ("checkpoints.reading", "checkpoints.tokenizers",   # tensors, headers, configs; tokenizers;
     "checkpoints.cache"),                        # the cache folder, the cached build, LRU
    ("checkpoints.tokenizer_panel",),             # what differs in tokenizers, chat templates
    ("checkpoints.writing",),                     # the sharded writer, output folders
    ("checkpoints.adapters",),                    # PEFT adapters: the reader, the applier
    ("checkpoints.embedded",),                    # the embedded models' registry (data rows)
    ("merge.partition", "merge.registry", "merge.config",   # partitions, the methods registry,
     "merge.mergekit_parts", "merge.method_layer_swap", "merge.method_soup",   # the methods, one
     "merge.method_task_arithmetic", "merge.method_ties",   # file each, and their mergekit parts;
     "merge.plan", "merge.apply"),                # the config, the pure merge plan, Source -> tensor
    ("checkpoints.references",),                  # model references resolved to folders
    ("checkpoints.loading", "checkpoints.compatibility",   # loading (adapters as dense models);
     "checkpoints.hub"),                          # the one compatibility check; served downloads
    ("checkpoints.preflight",),                   # the check from metadata, before a download
    ("merge.lora", "merge.executor", "merge.live", "merge.mergekit_yaml",   # adapter plans,
     "testing"),                                  # executor, live; mergekit YAML out and in
    ("analysis.providers", "analysis.deltas", "analysis.suggest"),  # LoRA deltas, statistics, swaps
    ("inference.calculator", "inference.prompts",    # the GSM8K calculator; the one chat renderer
     "inference.attention", "inference.stops"),   # decoding passes' attention; stop strings
    ("inference.products", "inference.lean"),     # CPU products of decoding; the lean Llama
    ("inference.prefill",),                       # the prompt pass, the growing batch cache
    ("inference.decoding",),                      # the refilled greedy loop
    ("inference.generation", "inference.chat"),   # batched generation; streaming and chat
    ("evaluation.languages",),                    # the one table of languages
    ("evaluation.mgsm_hub", "evaluation.data",
     "evaluation.registry",                       # every evaluation task registered once
     "evaluation.mgsm_task", "evaluation.runner", "evaluation.lmeval",   # evaluation
     "evaluation.tasks"),                         # task records and their one scorer
    ("training.config", "training.sft_data", "training.trainer",   # training: config, SFT data,
     "training.recipes"),                         # trainer; the data recipes' registry
    ("demos.bengali",),                           # the demo: Bengali's variants (fill-ins)
    ("demos.variants",),                          # its variant sets; the demo-variants task
    ("demos.recipes", "demos.trios"),             # its experts' recipes; one record per trio
    ("demos.folds",),                             # the cross-fitting's halves and trainings
    ("demos.measure", "demos.heldout"),           # its measure and statistics; experts' NLL
    ("demos.reproduce",),                         # the demo result reproduced
    ("demos.crossfit", "demos.control"),          # both folds pooled; the outer-layer control
    ("engines.pool",), ("engines.jobs",),          # engines over live models; plain-data jobs
    ("engines.dispatch",),                        # the one dispatcher (local, ZeroGPU)
    ("sweeps.grid", "sweeps.order", "sweeps.store"),   # sweeps: the grid, orders, results file
    ("sweeps.scoring", "sweeps.report"),          # scoring on one engine; table, best, heatmap
    ("sweeps.ray_backend",),                      # Ray actors (the only module importing ray)
    ("sweeps.backends",),                         # the backends: one record each, one mapping
    ("sweeps.runner",),                           # run_sweep: the one entry point of a sweep
    ("workbench.figures", "workbench.spaces", "workbench.served",   # figures, the ZeroGPU shim,
     "workbench.controls"),
    ("workbench.figures_demo",),                  # the demo result's per-template strip                       # which controls the method reads,
                                                  # limits, access and one-line errors
    ("workbench.saves", "workbench.preflight"),   # served disk: namespaces, quotas, temp files;
                                                  # the Models tab's pre-flight of a pick
    ("workbench.session",),                       # the session, its dispatcher, warm-ups
    ("workbench.models", "workbench.configure",   # the Models, Configure and Build tabs
     "workbench.build"),
    ("workbench.deltas", "workbench.evaluate", "workbench.sweep", "workbench.chat",
     "workbench.demo"),                          # the other tabs; the demo result
    ("workbench.agents",),                        # the tabs' steps as agent (MCP) tools
    ("cli", "cli.progress", "cli.partition", "cli.models", "cli.check", "cli.merge", "cli.lora",
     "cli.data", "cli.analysis", "cli.evaluate", "cli.train", "cli.sweep"),
    ("app_tabs", "app_tabs.common", "app_tabs.agents"),   # the page's shared part; MCP endpoints
    ("app_tabs.configure",),                      # the Configure tab (its controls feed others)
    ("app_tabs.models", "app_tabs.deltas", "app_tabs.build", "app_tabs.evaluate",   # the tabs
     "app_tabs.demo", "app_tabs.sweep", "app_tabs.chat", "app_tabs.budget"),
    ("__main__", "cli.__main__", "app"),          # entry points
]
# The only places that import modules by name at run time: the lazy API of the package root, and
# the CLI's command groups (a command imports its own group only: cli.COMMANDS names them all).
DYNAMIC_IMPORTS = {("layerswap_core", "__getattr__"), ("cli", "build_parser")}
# Library modules allowed to parse command lines: none (command lines live in cli/).
SCRIPTS: set[str] = set()


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """{module name relative to the package ("layerswap_core" for the root, "app", the tabs'
    modules in full: "app_tabs.models"): file}."""
    mods = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root / PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts) or PACKAGE] = path
    if (root / "app.py").exists():
        mods["app"] = root / "app.py"
    for path in sorted((root / TABS_PACKAGE).glob("*.py")):
        mods[TABS_PACKAGE + ("" if path.stem == "__init__" else "." + path.stem)] = path
    return mods


def _package_of(name: str, path: Path) -> list[str]:
    if name in (PACKAGE, "app"):
        return []
    parts = name.split(".")
    return parts if path.name == "__init__.py" else parts[:-1]


def _targets(node, name: str, path: Path, known) -> set[str]:
    """Modules an import statement of module ``name`` imports: ``from X import y`` imports
    the module X.y if there is one, else X (the package root when X is the package)."""
    def pick(module: str) -> str:
        return module or PACKAGE

    if isinstance(node, ast.Import):
        return ({pick(a.name.removeprefix(PACKAGE).lstrip(".")) for a in node.names
                 if a.name == PACKAGE or a.name.startswith(PACKAGE + ".")}
                | {a.name for a in node.names if a.name.split(".")[0] == TABS_PACKAGE})
    if node.level:
        base = _package_of(name, path)
        base = base[:len(base) - (node.level - 1)]
        module = ".".join(base + ([node.module] if node.module else []))
    elif node.module == PACKAGE or (node.module or "").startswith(PACKAGE + "."):
        module = node.module.removeprefix(PACKAGE).lstrip(".")
    elif (node.module or "").split(".")[0] == TABS_PACKAGE:
        module = node.module
    else:
        return set()
    out = set()
    for alias in node.names:
        sub = f"{module}.{alias.name}" if module else alias.name
        out.add(sub if sub in known else pick(module))
    return out


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """{module: modules it imports}, module- and function-level, within the package."""
    mods = module_files(root)
    graph = {}
    for name, path in mods.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges |= _targets(node, name, path, mods)
        graph[name] = (edges & set(mods)) - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for t in sorted(graph.get(m, ())):
            if state.get(t) == "open":
                return stack[stack.index(t):] + [t]
            if t not in state and (found := visit(t)):
                return found
        stack.pop()
        state[m] = "done"
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def upward_arrows(graph: dict[str, set[str]]) -> list[str]:
    rank = {m: i for i, layer in enumerate(LAYERS) for m in layer}
    return sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets
                  if rank[b] > rank[a])


def test_every_module_has_a_layer():
    placed = [m for layer in LAYERS for m in layer]
    assert len(placed) == len(set(placed)), "a module is in two layers"
    assert set(placed) == set(module_files()), "place new modules in LAYERS (and only real ones)"


def test_import_graph_has_no_cycle():
    assert find_cycle(import_graph()) is None


def test_no_module_imports_a_layer_above_it():
    assert upward_arrows(import_graph()) == []


def test_graph_sees_function_level_and_absolute_imports():
    graph = import_graph()
    # `from ..engines.dispatch import default as default_dispatcher` in a function (lazy)
    assert "engines.dispatch" in graph["sweeps.scoring"]
    # `from layerswap_core.workbench import session as wb`
    assert "workbench.session" in graph["app"]
    assert "cli.merge" in graph["cli.lora"] and "merge.executor" in graph["cli.merge"]
    assert PACKAGE in graph["merge.config"]        # `from .. import __version__`
    assert "app_tabs.build" in graph["app"]        # `from app_tabs.build import BuildTab`
    assert "app_tabs.configure" in graph["app_tabs.models"]   # `from .configure import ...`


def _dynamic_imports(node, where: str):
    """(where, function) of every importlib.import_module / __import__ call under ``node``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from _dynamic_imports(child, child.name)
            continue
        if isinstance(child, ast.Call) and (
                isinstance(child.func, ast.Attribute) and child.func.attr == "import_module"
                or isinstance(child.func, ast.Name) and child.func.id == "__import__"):
            yield where
        yield from _dynamic_imports(child, where)


def test_no_import_is_hidden_behind_importlib():
    found = {(name, where) for name, path in module_files().items()
             for where in _dynamic_imports(ast.parse(path.read_text(encoding="utf-8")), "<module>")}
    assert found == DYNAMIC_IMPORTS


def _imports_argparse(path: Path) -> bool:
    return any(isinstance(n, ast.Import) and any(a.name == "argparse" for a in n.names)
               or isinstance(n, ast.ImportFrom) and n.module == "argparse"
               for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))))


def test_library_modules_hold_no_command_line_code():
    library = {m: p for m, p in module_files().items()
               if m != "app" and m.split(".")[0] not in ("cli", "__main__")}
    parsing = {m for m, p in library.items() if _imports_argparse(p)}
    assert parsing == SCRIPTS, "command-line code goes in layerswap_core/cli/"


def test_the_checks_catch_a_cycle_and_an_upward_arrow(tmp_path):
    """The same checks on a copy of the package with one added import that closes a cycle."""
    import shutil

    shutil.copytree(ROOT / PACKAGE, tmp_path / PACKAGE, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "app.py", tmp_path / "app.py")
    shutil.copytree(ROOT / TABS_PACKAGE, tmp_path / TABS_PACKAGE,
                    ignore=shutil.ignore_patterns("__pycache__"))
    io_file = tmp_path / PACKAGE / "checkpoints" / "reading.py"
    io_file.write_text(io_file.read_text(encoding="utf-8")
                       + "\n\ndef _late():\n    from .references import resolve  # noqa\n",
                       encoding="utf-8")
    graph = import_graph(tmp_path)
    assert find_cycle(graph) is not None
    assert upward_arrows(graph) == ["checkpoints.reading -> checkpoints.references"]


# The rooms (sub-packages) bottom first; the data flows up this list only. Modules at the package
# root (the lazy API, testing helpers) and the entry points are outside the rooms.
ROOMS = ["checkpoints", "merge", "analysis", "inference", "evaluation", "training", "demos",
         "engines", "sweeps", "workbench",
         "cli"]


def room_arrows(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(room, room) pairs of the imports that cross rooms."""
    def room(m):
        head = m.split(".")[0]
        return head if head in ROOMS else None
    return {(room(a), room(b)) for a, targets in graph.items() for b in targets
            if room(a) and room(b) and room(a) != room(b)}


def test_rooms_import_only_rooms_below_them():
    rank = {r: i for i, r in enumerate(ROOMS)}
    up = sorted(f"{a} -> {b}" for a, b in room_arrows(import_graph()) if rank[b] > rank[a])
    assert up == []


def test_every_module_sits_in_a_room():
    outside = {m for m in module_files() if m.split(".")[0] not in ROOMS + [TABS_PACKAGE]}
    below_every_room = {"progress", "memory", "settings"}
    assert outside <= {PACKAGE, "__main__", "app", "testing", *below_every_room}, outside


# Optional extras: the modules allowed to import them (inside functions, so the core never
# needs them at import time).
OPTIONAL_IMPORTS = {"ray": {"sweeps.ray_backend"}}


def _imports_of(path: Path, top: str) -> list[ast.AST]:
    return [n for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(n, ast.Import) and any(a.name.split(".")[0] == top for a in n.names)
            or isinstance(n, ast.ImportFrom) and not n.level and (n.module or "").split(".")[0] == top]


def test_optional_extras_are_imported_only_where_allowed_and_only_in_functions():
    for top, allowed in OPTIONAL_IMPORTS.items():
        users = {m for m, p in module_files().items() if _imports_of(p, top)}
        assert users == allowed, f"{top} imported by {sorted(users - allowed)}"
        for m in allowed:
            tree = ast.parse(module_files()[m].read_text(encoding="utf-8"))
            at_top = [n for n in tree.body if n in _imports_of(module_files()[m], top)]
            assert not at_top, f"{m} imports {top} at module level"


def test_only_the_page_imports_gradio():
    """The library is plain functions over plain data (``workbench`` included: tested without a
    browser); Gradio's components, events and requests live in app.py and app_tabs/ only."""
    users = {m for m, p in module_files().items() if _imports_of(p, "gradio")}
    library = {m for m in users if m != "app" and m.split(".")[0] != TABS_PACKAGE}
    assert "app" in users and "app_tabs.common" in users     # the rule sees the page's imports
    assert library == set(), f"gradio imported by the library: {sorted(library)}"


# Package-internal imports sit at the top of their module, where a reader sees what the module
# depends on. One inside a function needs a reason on its line or the line above it, starting
# with "# lazy:" (a measured start-up cost, e.g. "# lazy: lm_eval import costs 4.1 s").
LAZY_MARK = "# lazy:"
# Modules whose function-level imports are moved by their owners in the same round (#27); the
# lead empties this set when those branches are merged.
IMPORTS_NOT_YET_MOVED: set[str] = set()


def _internal(node) -> bool:
    if isinstance(node, ast.ImportFrom):
        return bool(node.level) or (node.module or "").split(".")[0] == PACKAGE
    return isinstance(node, ast.Import) and any(a.name.split(".")[0] == PACKAGE for a in node.names)


def unexplained_function_imports(root: Path = ROOT) -> list[str]:
    """"module:line" of every package-internal import inside a function of the package without
    a "# lazy:" comment on its line or the line above."""
    found = []
    for name, path in module_files(root).items():
        if name == "app":
            continue
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for fn in ast.walk(ast.parse(text)):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if not _internal(node):
                    continue
                here = lines[node.lineno - 1]
                above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
                if LAZY_MARK not in here and not above.startswith(LAZY_MARK):
                    found.append(f"{name}:{node.lineno}")
    return sorted(set(found))


def test_package_imports_are_at_the_top_unless_marked_lazy():
    found = [f for f in unexplained_function_imports()
             if f.split(":")[0] not in IMPORTS_NOT_YET_MOVED]
    assert found == [], ("move these imports to the top of their module, or say why not in a "
                         "'# lazy: <measured cost>' comment: " + ", ".join(found))


def test_the_import_rule_catches_an_unmarked_import_and_accepts_a_marked_one(tmp_path):
    import shutil

    shutil.copytree(ROOT / PACKAGE, tmp_path / PACKAGE, ignore=shutil.ignore_patterns("__pycache__"))
    path = tmp_path / PACKAGE / "merge" / "plan.py"
    before = path.read_text(encoding="utf-8")
    start = len(before.splitlines())
    path.write_text(before + "\n\ndef _late():\n    from ..checkpoints import reading  # noqa\n"
                    "    # lazy: measured 1 s\n    from ..checkpoints import writing  # noqa\n",
                    encoding="utf-8")
    new = [f for f in unexplained_function_imports(tmp_path) if f.startswith("merge.plan:")]
    assert new == [f"merge.plan:{start + 4}"]


def test_the_limits_table_lists_every_max_variable_the_code_reads():
    """docs/app.md's limits table has one row for every LAYERSWAP_MAX_<NAME> read anywhere (the
    served Limits, the dispatcher, the engine pool, downloads, saves), with the Limits'
    defaults in brackets."""
    import re
    from dataclasses import fields

    from layerswap_core.workbench.served import Limits

    root = Path(__file__).resolve().parents[1]
    sources = [*(root / "layerswap_core").rglob("*.py"), *(root / "app_tabs").glob("*.py"),
               root / "app.py"]
    read = {m for p in sources for m in re.findall(r"LAYERSWAP_MAX_([A-Z][A-Z0-9_]*)",
                                                   p.read_text(encoding="utf-8"))}
    read |= {f.name.upper() for f in fields(Limits)}
    rows = dict(re.findall(r"^\| `([A-Z][A-Z0-9_]*)` \[([^\]]*)\]", (root / "docs" / "app.md")
                           .read_text(encoding="utf-8"), flags=re.M))
    assert set(rows) == read, (sorted(read - set(rows)), sorted(set(rows) - read))
    for f in fields(Limits):
        assert rows[f.name.upper()] == str(f.default), f.name


def test_performance_page_is_short_and_bench_readme_names_every_script():
    """docs/performance.md holds the current figures, not the history (that is
    docs/CHANGELOG-performance.md): under 300 lines. bench/README.md indexes the benchmarks:
    every ``bench/*.py`` script is named in it (as ``name.py``)."""
    lines = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) < 300, f"docs/performance.md has {len(lines)} lines (< 300)"
    index = (ROOT / "bench" / "README.md").read_text(encoding="utf-8")
    scripts = sorted(p.name for p in (ROOT / "bench").glob("*.py"))
    assert scripts
    missing = [s for s in scripts if f"`{s}`" not in index]
    assert not missing, f"bench/README.md does not name {missing}"


def test_the_documents_name_files_that_exist():
    """Every source file a document names in backticks (``room/module.py``, with a folder) is
    there: under the repository, under layerswap_core/, or in the installed package it names
    (``gradio/mcp.py``); and "Recipe `name` of `file`" names the file that registers that recipe.
    The history (CHANGELOG*.md) keeps the paths of its day. Files moved between rooms left the
    expert cards naming the old ones."""
    import importlib.util
    import re

    docs = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", ROOT / "bench" / "README.md",
            *sorted((ROOT / "docs").glob("*.md")),
            *sorted((ROOT / "assets" / "experts").glob("*/README.md"))]
    docs = [d for d in docs if not d.name.startswith("CHANGELOG")]
    assert len(docs) > 10

    def exists(path: str) -> bool:
        if (ROOT / path).is_file() or (ROOT / "layerswap_core" / path).is_file():
            return True
        spec = importlib.util.find_spec(path.split("/")[0])
        places = list(spec.submodule_search_locations or []) if spec else []
        return any(Path(place).parent.joinpath(path).is_file() for place in places)

    named, missing, recipes = 0, [], []
    for doc in docs:
        text = doc.read_text(encoding="utf-8")
        for path in re.findall(r"`([\w./-]+/[\w.-]+\.py)[`:]", text):
            named += 1
            if not exists(path):
                missing.append(f"{doc.relative_to(ROOT)}: {path}")
        for name, path in re.findall(r"[Rr]ecipe `([\w-]+)` of `([\w./-]+\.py)`", text):
            source = ROOT / path
            if not source.is_file() or f'"{name}"' not in source.read_text(encoding="utf-8"):
                recipes.append(f"{doc.relative_to(ROOT)}: {name} in {path}")
    assert named > 20
    assert not missing, missing
    assert not recipes, recipes


def test_architecture_md_names_every_module_of_each_room_once():
    """ARCHITECTURE.md's table has one row per room of layerswap_core (every package but the
    CLI face), and its modules column lists exactly the room's modules, each once."""
    import re

    root = Path(__file__).resolve().parents[1]
    rows = re.findall(r"^\| `([a-z_]+)/` \| ([^|]*) \|", (root / "ARCHITECTURE.md")
                      .read_text(encoding="utf-8"), flags=re.M)
    rooms = sorted(p.parent.name for p in (root / "layerswap_core").glob("*/__init__.py")
                   if p.parent.name != "cli")
    assert sorted(room for room, _ in rows) == rooms
    for room, cell in rows:
        listed = re.findall(r"`([a-z_]+)`", cell)
        have = sorted(p.stem for p in (root / "layerswap_core" / room).glob("*.py")
                      if p.stem != "__init__")
        assert sorted(listed) == have, (room, sorted(set(have) - set(listed)),
                                        sorted(set(listed) - set(have)),
                                        [m for m in listed if listed.count(m) > 1])


def test_no_private_name_crosses_a_module():
    """No module of layerswap_core, app.py or app_tabs imports another module's ``_name`` or
    reads one as ``module._name`` (public helpers, parameters passed instead)."""
    import re

    root = Path(__file__).resolve().parents[1]
    ours = {p.stem for p in (root / "layerswap_core").rglob("*.py")} | {"layerswap_core"}
    found = []
    for path in [*(root / "layerswap_core").rglob("*.py"), *(root / "app_tabs").glob("*.py"),
                 root / "app.py"]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        modules = set()   # names this file binds to one of our modules
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "")
                                                     .startswith("layerswap_core")):
                found += [f"{path.name}: from {node.module} import {a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
                modules |= {a.asname or a.name for a in node.names if a.name in ours}
            if isinstance(node, ast.Import):
                modules |= {a.asname or a.name.split(".")[0] for a in node.names
                            if a.name.startswith("layerswap_core")}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id in modules and re.fullmatch(r"_[A-Za-z]\w*", node.attr):
                found.append(f"{path.name}: {node.value.id}.{node.attr}")
    assert not found, found


# The page's modules that are no tab: the shared part every tab is given (``common``), the
# agent endpoints, the package's docstring.
NOT_TABS = {"__init__", "common", "agents"}


def _dataclass_fields(tree) -> set[str]:
    """The fields of the handles records (dataclasses) a module declares: what its tab
    publishes for the others."""
    names = set()
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        if any("dataclass" in ast.unparse(d) for d in cls.decorator_list):
            names |= {s.target.id for s in cls.body
                      if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
    return names


def _defined_on_tabs(tree) -> set[str]:
    """What a tab module defines on its tab objects: its classes' methods and class attributes,
    and every ``self.X = ...`` (or ``setattr(self, "X", ...)``)."""
    names = set()
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        if any("dataclass" in ast.unparse(d) for d in cls.decorator_list):
            continue
        for stmt in cls.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(stmt.name)
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                names |= {t.id for t in targets if isinstance(t, ast.Name)}
        for node in ast.walk(cls):
            targets = (node.targets if isinstance(node, ast.Assign)
                       else [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign))
                       else [i.context_expr for i in node.items] if isinstance(node, ast.With)
                       else [])
            for t in targets:
                for sub in ast.walk(t):
                    if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) \
                            and sub.value.id == "self":
                        names.add(sub.attr)
            for item in (node.items if isinstance(node, ast.With) else []):
                var = item.optional_vars
                if isinstance(var, ast.Attribute) and isinstance(var.value, ast.Name) \
                        and var.value.id == "self":
                    names.add(var.attr)
    return names


def _reads(tree) -> list[tuple[int, str, str]]:
    """(line, name, how) of every attribute a module reads by name: ``x.name`` (``x`` anything
    but a module it imports), ``getattr(x, "name")``, a name in a class's declarations (an
    outputs tuple) or given to a decorator (``guarded("name")``); and (line, "?", how) for a
    ``getattr``/``setattr`` on ``self`` whose name is computed, which no reader can follow."""
    modules = {a.asname or a.name.split(".")[0] for n in ast.walk(tree)
               if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    named = []   # the strings that name attributes
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            named += [s for stmt in node.body if isinstance(stmt, (ast.Assign, ast.AnnAssign))
                      and stmt.value is not None for s in ast.walk(stmt.value)]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            named += [s for d in node.decorator_list for s in ast.walk(d)]
    found = [(s.lineno, s.value, repr(s.value)) for s in named
             if isinstance(s, ast.Constant) and isinstance(s.value, str)]
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and not (isinstance(node.value, ast.Name)
                                                    and node.value.id in modules):
            found.append((node.lineno, node.attr, ast.unparse(node)))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("getattr", "setattr", "hasattr") and len(node.args) > 1:
            name = node.args[1]
            if isinstance(name, ast.Constant):
                found.append((node.lineno, str(name.value), ast.unparse(node)))
            elif isinstance(node.args[0], ast.Name) and node.args[0].id == "self":
                found.append((node.lineno, "?", ast.unparse(node)))
    return found


def cross_tab_reads(root: Path = ROOT) -> list[str]:
    """"module:line how" of every read, in a module of app_tabs/, of an attribute another tab
    defines on its own objects (a component, a callback, a method) and does not publish in its
    handles record; and of every computed ``getattr(self, ...)`` in a tab (``common`` may
    compute names: it resolves a tab's declared outputs)."""
    trees = {p.stem: ast.parse(p.read_text(encoding="utf-8"))
             for p in sorted((root / TABS_PACKAGE).glob("*.py"))}
    published = set().union(*(_dataclass_fields(t) for t in trees.values()))
    shared = _defined_on_tabs(trees["common"]) if "common" in trees else set()
    defined = {m: _defined_on_tabs(t) for m, t in trees.items() if m not in NOT_TABS}
    found = []
    for module, tree in trees.items():
        own = defined.get(module, set()) | shared | published
        others = set().union(*(names for m, names in defined.items() if m != module)) - own
        for line, name, how in _reads(tree):
            if name in others or (name == "?" and module not in NOT_TABS):
                found.append(f"{module}:{line} {how}")
    return found


def test_no_tab_reads_another_tabs_attributes():
    """Each tab of the page is its own object: what it needs of another tab (a component, a
    callback) reaches it explicitly, as a field of that tab's handles record or an argument
    of its wiring, never by reading the other tab's attributes (through ``self``, a
    ``getattr``, a name in an outputs tuple or otherwise)."""
    found = cross_tab_reads()
    assert found == [], "pass it in the other tab's handles record instead: " + "; ".join(found)


def test_the_tab_rule_catches_a_planted_read(tmp_path):
    """The rule on a copy of app_tabs/ where the Build tab reads the Configure tab's own
    method through ``self``, and where the Chat tab names an attribute by a computed name."""
    import shutil

    shutil.copytree(ROOT / TABS_PACKAGE, tmp_path / TABS_PACKAGE,
                    ignore=shutil.ignore_patterns("__pycache__"))
    build = tmp_path / TABS_PACKAGE / "build.py"
    build.write_text(build.read_text(encoding="utf-8")
                     + "\n\ndef _late(self):\n    return self.update_plan\n", encoding="utf-8")
    chat = tmp_path / TABS_PACKAGE / "chat.py"
    chat.write_text(chat.read_text(encoding="utf-8")
                    + "\n\ndef _late(self, name):\n    return getattr(self, name)\n",
                    encoding="utf-8")
    found = cross_tab_reads(tmp_path)
    assert [f.split(":")[0] for f in found] == ["build", "chat"], found
    assert "self.update_plan" in found[0] and "getattr(self, name)" in found[1]
