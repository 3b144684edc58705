"""Recipes: render (sandboxed Jinja) -> parse (safe YAML with lines) -> validate -> Recipe."""

from __future__ import annotations

import copy
import difflib
import hashlib
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import jinja2
import yaml
from jinja2 import meta, nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from winml_recipes.catalog import CatalogEntry, default_catalog_dir, load_entry
from winml_recipes.data import PARTIALS, builtin_dir
from winml_recipes.presets import default_steps, devices, precisions, resolve_target
from winml_recipes.schemas import recipe_schema
from winml_recipes.sdk.errors import CatalogError, RecipeError, WinmlError
from winml_recipes.sdk.target import Target
from winml_recipes.yamlfile import LoadedYaml, load_yaml, validate

PARTIALS_DIR = "_partials"
# Names the tool sets itself; `-D device=npu` would otherwise be silently overridden.
RESERVED_VARIABLES = ("device", "precision", "catalog")
# Upper bounds for `*` and `**` in templates, so `{{ 'x' * 10**10 }}` fails instead of
# exhausting memory.
MAX_SEQUENCE_LENGTH = 1_000_000
MAX_POWER_BITS = 4096
# A recipe renders in well under a second; these bound what a hostile one can cost.
MAX_RENDER_SECONDS = 10.0
MAX_RENDER_CHARS = 10_000_000
# String methods and filters whose integer arguments size their result.
_SIZING_METHODS = frozenset({"ljust", "rjust", "center", "zfill", "expandtabs"})
_SIZING_FILTERS = ("center", "indent", "wordwrap", "truncate", "batch", "slice")
_FORMAT_WIDTH = re.compile(r"\d{7,}|\*")
_MODEL_LINE = re.compile(r"^model:\s*['\"]?([A-Za-z0-9][A-Za-z0-9._-]*)['\"]?\s*(#.*)?$", re.M)


@dataclass(frozen=True)
class Step:
    name: str
    options: dict[str, Any]
    line: int  # of the rendered recipe; 0 for steps from the presets
    from_presets: bool = False


@dataclass(frozen=True)
class Recipe:
    name: str
    path: Path
    model: str
    targets: tuple[Target, ...]
    target: Target
    catalog: CatalogEntry
    components: dict[str, tuple[Step, ...]]  # in catalog order, steps resolved
    dims: dict[str, dict[str, int]]  # per-component dim overrides
    seed: int
    rendered: str
    variables: dict[str, Any] = field(default_factory=dict)
    source: str | None = None  # the catalog's named source built from (None: its only one)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.rendered.encode()).hexdigest()


def parse_defines(defines: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """`-D key=value` pairs; values are read as YAML scalars (1 -> int, true -> bool)."""
    out: dict[str, Any] = {}
    for item in defines:
        key, sep, value = item.partition("=")
        if not sep or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
            raise RecipeError(f"-D '{item}': expected key=value with an identifier key")
        if key in RESERVED_VARIABLES:
            hint = f"use --{key}" if key != "catalog" else "use --catalog DIR"
            raise RecipeError(f"-D '{item}': '{key}' is set by the tool; {hint}")
        if key in out:
            raise RecipeError(f"-D '{item}': '{key}' is given twice")
        if any(c in value for c in "\r\n\x00") or not value.isprintable():
            raise RecipeError(
                f"-D '{key}=...': values are one line of printable text (they are inserted "
                "into the recipe, where a newline could add keys)"
            )
        out[key] = _define_value(key, value) if value else ""
    return out


MAX_DEFINE_NODES = 1000


def _define_value(key: str, value: str) -> Any:
    """A YAML value (1 -> int, [1, 2] -> list); no aliases (a 100-byte alias bomb renders to
    gigabytes of text) and at most MAX_DEFINE_NODES nodes. Unparsable text stays a string."""
    try:
        root = yaml.compose(value, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return value
    except RecursionError:
        raise RecipeError(f"-D '{key}=...': nested too deeply") from None
    seen: set[int] = set()
    pending = [root] if root is not None else []
    while pending:
        node = pending.pop()
        if id(node) in seen or len(seen) >= MAX_DEFINE_NODES:
            raise RecipeError(
                f"-D '{key}=...': YAML aliases and values of more than {MAX_DEFINE_NODES} "
                "items are not allowed"
            )
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            pending.extend(node.value)
        elif isinstance(node, yaml.MappingNode):
            pending.extend(n for pair in node.value for n in pair)
    try:
        return yaml.safe_load(value)
    except yaml.YAMLError:
        return value


class _RecipeSandbox(ImmutableSandboxedEnvironment):
    """No attribute escapes, no mutation of passed-in data, bounded `*`, `**`, `%`, string
    widths and filter sizes, and a render deadline checked at every call and attribute."""

    intercepted_binops = frozenset({"*", "**", "%"})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        import time

        self.deadline = time.monotonic() + MAX_RENDER_SECONDS
        self.globals.pop("lipsum", None)  # text generation has no place in a recipe
        for name in _SIZING_FILTERS:
            if name in self.filters:
                self.filters[name] = _bounded(self.filters[name], f"the '{name}' filter")
        self.filters["format"] = _bounded_format(self.filters["format"])

    def _check_deadline(self) -> None:
        import time

        if time.monotonic() > self.deadline:
            raise jinja2.exceptions.SecurityError(
                f"rendering takes more than {MAX_RENDER_SECONDS:g} s; simplify the loops"
            )

    def getattr(self, obj: Any, attribute: str) -> Any:
        self._check_deadline()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        self._check_deadline()
        return super().getitem(obj, argument)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        __self._check_deadline()
        owner = getattr(__obj, "__self__", None)
        name = getattr(__obj, "__name__", "")
        if isinstance(owner, str) and name in _SIZING_METHODS:
            _check_sizes(args, kwargs, f"str.{name}")
        return super().call(__context, __obj, *args, **kwargs)

    def wrap_str_format(self, value: Any) -> Any:
        """jinja2 wraps `str.format` at attribute access: check the format string there."""
        owner = getattr(value, "__self__", None)
        if isinstance(owner, str) and getattr(value, "__name__", "") in ("format", "format_map"):
            _check_format(owner)
        return super().wrap_str_format(value)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if (
            operator == "**"
            and isinstance(left, int)
            and isinstance(right, int)
            and right > 0
            and abs(left) > 1
            and right * abs(left).bit_length() > MAX_POWER_BITS
        ):
            raise jinja2.exceptions.SecurityError(f"{left} ** {right} is too large for a recipe")
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if (
                    isinstance(seq, str | list | tuple)
                    and isinstance(n, int)
                    and len(seq) * n > MAX_SEQUENCE_LENGTH
                ):
                    raise jinja2.exceptions.SecurityError(
                        f"repeating a sequence {n} times is too large for a recipe"
                    )
        if operator == "%" and isinstance(left, str):
            _check_format(left)
        self._check_deadline()
        return super().call_binop(context, operator, left, right)


def _check_sizes(args: tuple[Any, ...], kwargs: dict[str, Any], what: str) -> None:
    for value in [*args, *kwargs.values()]:
        if isinstance(value, int) and not isinstance(value, bool) and value > MAX_SEQUENCE_LENGTH:
            raise jinja2.exceptions.SecurityError(f"{what}({value}) is too large for a recipe")


def _check_format(fmt: str) -> None:
    """Refuse format strings with huge or computed (`*`) widths."""
    if _FORMAT_WIDTH.search(fmt):
        raise jinja2.exceptions.SecurityError(
            "format widths of a million or more, or '*' widths, are too large for a recipe"
        )


def _bounded(fn: Any, what: str) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _check_sizes(args[1:], kwargs, what)
        return fn(*args, **kwargs)

    return _keep_pass_arg(fn, wrapper)


def _bounded_format(fn: Any) -> Any:
    def wrapper(value: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(value, str):
            _check_format(value)
        return fn(value, *args, **kwargs)

    return _keep_pass_arg(fn, wrapper)


def _keep_pass_arg(fn: Any, wrapper: Any) -> Any:
    """jinja2 marks some filters pass_environment/pass_context: the wrapper must say so too."""
    import functools

    wrapper = functools.wraps(fn)(wrapper)
    if hasattr(fn, "jinja_pass_arg"):
        wrapper.jinja_pass_arg = fn.jinja_pass_arg
    return wrapper


def _read_text(path: Path, error: type[WinmlError] = RecipeError) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise error(
            f"not a UTF-8 text file (byte {exc.start}); is this really a recipe?",
            where=str(path),
        ) from None
    except OSError as exc:
        raise error(f"cannot read: {exc.strerror}", where=str(path)) from None


def _template_line(exc: BaseException, filename: str) -> int | None:
    line = getattr(exc, "lineno", None)
    if line:
        return line
    tb = exc.__traceback__
    found = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename in (filename, "<template>"):
            found = tb.tb_lineno
        tb = tb.tb_next
    return found


class _UnsafeInclude(jinja2.TemplateNotFound):
    """An include that exists but may not be read (a link out of the partials, a pipe)."""

    def __init__(self, name: str, problem: str) -> None:
        super().__init__(name)
        self.problem = problem


class _PartialsLoader(jinja2.BaseLoader):
    """Includes are regular files inside a partials folder, after resolving symlinks: the
    recipe's own `_partials/` first, then the built-in partials (a name in both: the
    project's).

    jinja2's FileSystemLoader refuses `..` in names but follows a symlink wherever it
    points; a cloned recipe repository can carry such a link. Checked before reading, and
    an unsafe file is an error, never a reason to fall back to the next folder.
    """

    def __init__(self, roots: list[Path]) -> None:
        self.roots = roots

    def get_source(self, environment, template):
        from jinja2.loaders import split_template_path

        pieces = split_template_path(template)
        for root in self.roots:
            candidate = root.joinpath(*pieces)
            if not (candidate.exists() or candidate.is_symlink()):
                continue
            real, base = candidate.resolve(), root.resolve()
            if base not in real.parents:
                raise _UnsafeInclude(template, "is a link that leaves the partials directory")
            if not real.is_file():
                raise _UnsafeInclude(template, "is not a regular file")
            try:
                text = real.read_text(encoding="utf-8")
            except UnicodeDecodeError as exc:
                raise _UnsafeInclude(template, f"is not UTF-8 text (byte {exc.start})") from None
            mtime = real.stat().st_mtime
            return text, str(candidate), lambda f=real, t=mtime: f.stat().st_mtime == t
        raise jinja2.TemplateNotFound(template)


def partials_dirs(path: Path) -> list[Path]:
    """Where a recipe's includes are looked up: its own `_partials/`, then the built-ins."""
    return [path.parent / PARTIALS_DIR, builtin_dir(PARTIALS)]


def _environment(path: Path) -> ImmutableSandboxedEnvironment:
    return _RecipeSandbox(
        loader=_PartialsLoader(partials_dirs(path)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


def _include_problem(name: str) -> str | None:
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name):
        return "is an absolute path"
    if ".." in re.split(r"[\\/]", name):
        return "leaves the partials directory ('..')"
    return None


def _render_bounded(template: jinja2.Template, env: _RecipeSandbox, variables: dict) -> str:
    """Render chunk by chunk, within the deadline and the output size."""
    chunks: list[str] = []
    size = 0
    for chunk in template.generate(**variables):
        size += len(chunk)
        if size > MAX_RENDER_CHARS:
            raise jinja2.exceptions.SecurityError(
                f"the rendered recipe exceeds {MAX_RENDER_CHARS} characters"
            )
        env._check_deadline()
        chunks.append(chunk)
    return "".join(chunks)


def render(path: Path, variables: dict[str, Any]) -> str:
    """Render a recipe template in a sandbox; undefined names are errors."""
    env = _environment(path)
    partials = path.parent / PARTIALS_DIR
    source = _read_text(path)
    try:
        template = env.from_string(source)
        template.filename = str(path)
        return _render_bounded(template, env, variables)
    except jinja2.TemplateSyntaxError as exc:
        where = f"{exc.filename or path}:{exc.lineno}"
        raise RecipeError(f"template syntax error: {exc.message}", where=where) from None
    except jinja2.TemplateNotFound as exc:
        line = _template_line(exc, str(path)) or 1
        problem = getattr(exc, "problem", None) or _include_problem(str(exc.name))
        if problem:
            message = f"include '{exc.name}' {problem}; includes are file names inside {partials}"
        else:
            message = f"include '{exc.name}' not found in {partials} or the built-in partials"
        raise RecipeError(message, where=f"{path}:{line}") from None
    except jinja2.exceptions.SecurityError as exc:
        line = _template_line(exc, str(path)) or 1
        raise RecipeError(f"not allowed in a recipe: {exc}", where=f"{path}:{line}") from None
    except jinja2.UndefinedError as exc:
        line = _template_line(exc, str(path)) or 1
        msg = str(exc)
        if "unsafe" in msg:
            raise RecipeError(f"not allowed in a recipe: {msg}", where=f"{path}:{line}") from None
        known = ", ".join(sorted(variables))
        raise RecipeError(
            f"undefined variable: {msg}; known: {known} (add more with -D key=value)",
            where=f"{path}:{line}",
        ) from None
    except jinja2.TemplateError as exc:
        line = _template_line(exc, str(path)) or 1
        raise RecipeError(f"template error: {exc}", where=f"{path}:{line}") from None
    except (MemoryError, OverflowError, RecursionError, ArithmeticError, TypeError) as exc:
        line = _template_line(exc, str(path)) or 1
        detail = str(exc) or type(exc).__name__
        raise RecipeError(
            f"template error: {type(exc).__name__}: {detail}", where=f"{path}:{line}"
        ) from None


def used_variables(path: Path) -> set[str] | None:
    """Names a recipe (and the partials it includes by constant name) reads; None if unknown."""
    env = _environment(path)
    found: set[str] = set()
    pending: list[tuple[str, str]] = [(str(path), _read_text(path))]
    seen: set[str] = set()
    while pending:
        name, source = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            ast = env.parse(source)
        except jinja2.TemplateSyntaxError:
            return None
        found |= meta.find_undeclared_variables(ast)
        for node in ast.find_all((nodes.Include, nodes.Import, nodes.FromImport, nodes.Extends)):
            target = node.template
            if not isinstance(target, nodes.Const) or not isinstance(target.value, str):
                return None  # a computed include: any variable may be used there
            try:
                text, _, _ = env.loader.get_source(env, target.value)
            except jinja2.TemplateNotFound:
                continue  # render() reports it with a line number
            pending.append((target.value, text))
    return found


def check_defines(path: Path, defines: dict[str, Any]) -> None:
    """A `-D` the recipe never reads is a typo, not a silent no-op."""
    if not defines:
        return
    used = used_variables(path)
    if used is None:
        return
    for key in defines:
        if key not in used:
            candidates = sorted(used - set(RESERVED_VARIABLES))
            close = difflib.get_close_matches(key, candidates, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            reads = ", ".join(candidates) or "none"
            raise RecipeError(
                f"-D {key}: the recipe does not use '{key}'{hint}; variables it reads: {reads}",
                where=str(path),
            )


def _peek_model(source: str) -> tuple[str, int] | None:
    match = _MODEL_LINE.search(source)
    if not match:
        return None
    return match.group(1), source.count("\n", 0, match.start()) + 1


def _load_catalog(name: str, catalog_dir: Path | None, where: str) -> CatalogEntry:
    """The recipe's catalog entry; an unknown name is reported at the recipe's `model:` line."""
    try:
        return load_entry(name, catalog_dir)
    except CatalogError as exc:
        if exc.where:  # the entry exists but is invalid: point into the catalog file
            raise
        raise RecipeError(f"$.model: {exc.message}", where=where) from None


def load_recipe(
    path: Path | str,
    *,
    device: str | None = None,
    precision: str | None = None,
    defines: dict[str, Any] | None = None,
    catalog_dir: Path | None = None,
    source: str | None = None,
    ep: str | None = None,
) -> Recipe:
    """Load a recipe for one target; unspecified parts come from its first matching target.

    `source` picks one of the catalog's named `sources` (default: the recipe's `source:`,
    else the first one listed). `ep` picks among targets of one device and precision by
    execution provider.
    """
    path = Path(path)
    if not path.is_file():
        what = "is a directory, expected a recipe file" if path.is_dir() else "recipe not found"
        raise RecipeError(what, where=str(path))
    # A typo in --device/--precision is reported before the template sees the value.
    resolve_target(device or devices()[0], precision or precisions()[0])
    catalog_dir = catalog_dir or default_catalog_dir(path)
    peeked = _peek_model(_read_text(path))
    catalog = _load_catalog(peeked[0], catalog_dir, f"{path}:{peeked[1]}") if peeked else None
    # First pass: learn the declared targets (rendered with the requested or placeholder values).
    probe = _render_and_validate(path, device or "cpu", precision or "fp32", defines, catalog)
    targets = tuple(
        resolve_target(t["device"], t["precision"], t.get("ep")) for t in probe.data["targets"]
    )
    chosen = _choose_target(targets, device, precision, probe, path, ep)
    loaded = probe
    if (chosen.device, chosen.precision) != (device or "cpu", precision or "fp32"):
        loaded = _render_and_validate(path, chosen.device, chosen.precision, defines, catalog)
    data = loaded.data
    if catalog is None or catalog.name != data["model"]:
        where = f"{path}:{loaded.lines.get(('model',), 1)}"
        catalog = _load_catalog(data["model"], catalog_dir, where)
    check_defines(path, defines or {})
    components, dims = _components(loaded, catalog, chosen, str(path))
    chosen_source = _choose_source(catalog, source, data.get("source"), loaded, path)
    return Recipe(
        name=data["name"],
        path=path,
        model=data["model"],
        targets=targets,
        target=chosen,
        catalog=catalog,
        components=components,
        dims=dims,
        seed=int(data.get("seed", 0)),
        rendered=loaded.text,
        variables={**(defines or {}), "device": chosen.device, "precision": chosen.precision},
        source=chosen_source,
    )


def _choose_source(
    catalog: CatalogEntry,
    requested: str | None,
    declared: str | None,
    loaded: LoadedYaml,
    path: Path,
) -> str | None:
    """The named catalog source to build from: --source, else the recipe's, else the first."""
    from winml_recipes.sdk.errors import check_known

    names = catalog.source_names
    name = requested or declared
    where = f"{path}:{loaded.lines.get(('source',), 1)}" if not requested else "--source"
    if name is None:
        return names[0] if names else None
    if not names:
        raise RecipeError(
            f"source '{name}': catalog '{catalog.name}' has one source per component; "
            "drop the source choice",
            where=where,
        )
    try:
        check_known(name, names, "source")
    except WinmlError as exc:
        raise RecipeError(exc.message, where=where) from None
    missing = [c.name for c in catalog.components.values() if c.sources and name not in c.sources]
    if missing:
        raise RecipeError(
            f"source '{name}' is not offered by component(s) {', '.join(missing)} of catalog "
            f"'{catalog.name}'",
            where=where,
        )
    return name


def _render_and_validate(
    path: Path,
    device: str,
    precision: str,
    defines: dict[str, Any] | None,
    catalog: CatalogEntry | None,
) -> LoadedYaml:
    variables: dict[str, Any] = {**(defines or {}), "device": device, "precision": precision}
    if catalog is not None:
        variables["catalog"] = copy.deepcopy(catalog.data)
    rendered = render(path, variables)
    try:
        loaded = load_yaml(rendered, str(path), RecipeError)
        if not isinstance(loaded.data, dict):
            raise RecipeError("a recipe must be a YAML mapping", where=f"{path}:1")
        validate(loaded, recipe_schema(), str(path), RecipeError)
    except RecipeError as exc:
        exc.where = source_location(exc.where, rendered, path)
        raise
    return loaded


def source_location(where: str, rendered: str, path: Path) -> str:
    """Map `FILE:LINE` of the rendered recipe back to the template or partial it came from.

    Jinja renders comments, blocks and includes into a different number of lines, so a
    line of the rendered text is located by its content: the one template line (or partial
    line) with the same text. When that is ambiguous the rendered line is kept and said so.
    """
    prefix = f"{path}:"
    if not where.startswith(prefix) or not where[len(prefix) :].isdigit():
        return where
    line = int(where[len(prefix) :])
    rendered_lines = rendered.splitlines()
    source_lines = path.read_text(encoding="utf-8-sig").splitlines()
    if len(rendered_lines) == len(source_lines) and (
        0 < line <= len(source_lines) and source_lines[line - 1] == rendered_lines[line - 1]
    ):
        return where
    if not 0 < line <= len(rendered_lines):
        return where
    text = rendered_lines[line - 1].strip()
    candidates = [(path, i + 1) for i, s in enumerate(source_lines) if s.strip() == text]
    for partials in partials_dirs(path) if not candidates else []:
        if not partials.is_dir():
            continue
        base = partials.resolve()
        for partial in sorted(partials.rglob("*")):
            # the same rule as includes: regular files inside the partials, links resolved
            if not partial.is_symlink() and partial.is_file() and base in partial.resolve().parents:
                lines = partial.read_text(encoding="utf-8", errors="replace").splitlines()
                candidates += [(partial, i + 1) for i, s in enumerate(lines) if s.strip() == text]
    if text and len(candidates) == 1:
        return f"{candidates[0][0]}:{candidates[0][1]}"
    return f"{where} (line of the rendered recipe)"


def _choose_target(
    targets: tuple[Target, ...],
    device: str | None,
    precision: str | None,
    loaded: LoadedYaml,
    path: Path,
    ep: str | None = None,
) -> Target:
    if device is not None:
        resolve_target(device, precision or targets[0].precision)
    if precision is not None:
        resolve_target(device or targets[0].device, precision)
    if ep is not None:
        from winml_recipes.sdk.ep import ep_key

        ep = ep_key(ep)
    for t in targets:
        if (
            device in (None, t.device)
            and precision in (None, t.precision)
            and (ep is None or ep in (t.ep, t.execution_provider))
        ):
            return t
    declared = ", ".join(t.label for t in targets)
    asked = f"{device or '*'}/{precision or '*'}" + (f"/{ep}" if ep else "")
    raise RecipeError(
        f"$.targets: {asked} is not a target of this recipe (declared: {declared}); "
        "add it to targets",
        where=f"{path}:{loaded.lines.get(('targets',), 1)}",
    )


_DATA_KEYS = ("npz", "images", "dataset")


def _auto_scores_on_held_out(steps: tuple[Step, ...]) -> tuple[Step, ...]:
    """Automatic mixed precision without data of its own scores on the verify step's
    held-out data when it has some (never on the calibration samples)."""
    held_out = next(
        (
            {k: v for k, v in s.options.items() if k in (*_DATA_KEYS, "skip")}
            for s in steps
            if s.name == "verify" and any(s.options.get(k) for k in _DATA_KEYS)
        ),
        None,
    )
    if held_out is None:
        return steps
    out = []
    for step in steps:
        mixed = step.options.get("mixed_precision") if step.name == "quantize" else None
        auto = mixed.get("auto") if isinstance(mixed, dict) else None
        if isinstance(auto, dict) and not any(auto.get(k) for k in _DATA_KEYS):
            options = {**step.options, "mixed_precision": {**mixed, "auto": {**auto, **held_out}}}
            step = replace(step, options=options)
        out.append(step)
    return tuple(out)


def _components(
    loaded: LoadedYaml, catalog: CatalogEntry, target: Target, filename: str
) -> tuple[dict[str, tuple[Step, ...]], dict[str, dict[str, int]]]:
    data = loaded.data
    declared = data.get("components", {}) or {}
    for cname in declared:
        if cname not in catalog.components:
            names = list(catalog.components)
            close = difflib.get_close_matches(cname, names, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            line = loaded.key_lines.get(("components", cname), 1)
            raise RecipeError(
                f"$.components: unknown component '{cname}'{hint}; "
                f"catalog '{catalog.name}' has: {', '.join(names)}",
                where=f"{filename}:{line}",
            )
    components: dict[str, tuple[Step, ...]] = {}
    dims: dict[str, dict[str, int]] = {}
    for cname in catalog.components:
        own = declared.get(cname) or {}
        if "steps" in own:
            raw, base = own["steps"], ("components", cname, "steps")
        elif "steps" in data:
            raw, base = data["steps"], ("steps",)
        else:
            try:
                raw, base = default_steps(target), None
            except WinmlError as exc:
                raise RecipeError(exc.message, where=f"{filename}:1") from None
        steps = []
        for i, item in enumerate(raw):
            name, options = (item, {}) if isinstance(item, str) else next(iter(item.items()))
            line = loaded.lines.get((*base, i), 1) if base else 0
            steps.append(Step(name, dict(options or {}), line, from_presets=base is None))
        components[cname] = _auto_scores_on_held_out(tuple(steps))
        dims[cname] = {**data.get("dims", {}), **own.get("dims", {})}
    return _zero_shot_paired(catalog, components), dims


ZERO_SHOT_TASK = "zero-shot-image-classification"


def _zero_shot_paired(
    catalog: CatalogEntry, components: dict[str, tuple[Step, ...]]
) -> dict[str, tuple[Step, ...]]:
    """A two-tower entry (task zero-shot-image-classification, one text-embedding and one
    image-embedding component): the image tower's preset verify also judges the towers
    together (`verify.zero_shot_with`); a recipe that writes its own steps says it itself."""
    if catalog.data.get("task") != ZERO_SHOT_TASK:
        return components
    by_task = {c.task: n for n, c in catalog.components.items()}
    text, image = by_task.get("text-embedding"), by_task.get("image-embedding")
    if text is None or image is None:
        return components
    steps = tuple(
        replace(s, options={"zero_shot_with": text, **s.options})
        if s.name == "verify" and s.from_presets
        else s
        for s in components[image]
    )
    return {**components, image: steps}
