"""Read a Spec or DynamicSpec file into plain Python data, the format chosen by extension.

``.yson`` is parsed by ytsaurus-client's ``yt.yson`` (both a whole map and Flow's map fragment
``"computations" = {...};`` load), ``.yaml``/``.yml`` by PyYAML, ``.json`` by the stdlib.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from egress.errors import SpecError

SUPPORTED_EXTENSIONS = (".yson", ".yaml", ".yml", ".json")


def load_document(path: str | Path) -> dict[str, Any]:
    """Parse the file at ``path`` into a ``dict``.

    Raises :class:`SpecError` (naming the file) when the file is missing or unreadable, the
    extension is not one of ``.yson``, ``.yaml``, ``.yml``, ``.json``, the text does not parse, or
    the top level is not a map.
    """
    file = str(path)
    source = Path(path)
    suffix = source.suffix.lower()
    if source.is_dir():
        inside = sorted(p.name for p in source.iterdir() if p.suffix.lower() in SUPPORTED_EXTENSIONS)
        raise SpecError("is a directory: name the Spec file in it" + (f" (there: {', '.join(inside)})" if inside
                                                                       else ""), file=file)
    if suffix not in SUPPORTED_EXTENSIONS:
        raise SpecError(
            f"unknown spec format {suffix or '(no extension)'!r}: name the file *.yson, *.yaml or *.json",
            file=file,
        )
    try:
        data = source.read_bytes()
    except FileNotFoundError:
        raise SpecError("file not found", file=file) from None
    except OSError as error:
        raise SpecError(f"cannot read: {error.strerror}", file=file) from None
    try:
        document = parse_text(data, suffix)
    except SpecError as error:
        raise error.at(file=file) from None
    return document


def parse_text(data: bytes, suffix: str) -> dict[str, Any]:
    """Parse ``data`` as the format of ``suffix``; raises :class:`SpecError` without a file name."""
    try:
        if suffix == ".yson":
            document = _parse_yson(data)
        elif suffix in (".yaml", ".yml"):
            document = _parse_yaml(data)
        else:
            document = _parse_json(data)
    except SpecError:
        raise
    except Exception as error:  # each parser has its own error types; all mean "does not parse"
        raise SpecError(f"does not parse as {suffix.lstrip('.').upper()}: {_one_line(error)}") from None
    if document is None:
        document = {}
    if not isinstance(document, dict):
        raise SpecError(f"the top level must be a map, got {type(document).__name__}")
    return document


def _parse_yaml(data: bytes) -> Any:
    """PyYAML's safe load (libyaml's C parser when PyYAML was built with it), refusing a mapping
    that has a key twice: PyYAML keeps the last value, so the other would be dropped unseen."""
    import yaml  # only for a YAML file: its import compiles large regular expressions

    fast = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        return _load_yaml(fast, data)
    except yaml.YAMLError:
        if fast is yaml.SafeLoader:
            raise
        # libyaml's messages omit the offending character (a tab) and the line's text: ask the
        # pure-Python parser, which gives both; only a file that does not parse pays for it.
        return _load_yaml(yaml.SafeLoader, data)


def _load_yaml(loader_class: Any, data: bytes) -> Any:
    loader = loader_class(data)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _refuse_duplicate_keys(loader, node, [], set())
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _refuse_duplicate_keys(loader: Any, node: Any, path: list[str], seen: set[int]) -> None:
    """Raise :class:`SpecError` at the first mapping under ``node`` (a composed YAML node at
    ``path``) with a key written twice; ``seen`` holds the ids of nodes already walked (an alias
    repeats its anchor's node)."""
    import yaml

    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _refuse_duplicate_keys(loader, item, [*path, str(index)], seen)
    elif isinstance(node, yaml.MappingNode):
        first_line: dict[Any, int] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue  # a "<<" merge key's entries may be overridden: that is what it is for
            key = loader.construct_object(key_node)
            line = key_node.start_mark.line + 1
            if key in first_line:
                raise SpecError(f"the key {key!r} is written twice (lines {first_line[key]} and {line}); "
                                "only one value would be kept: remove one of them",
                                path="/".join([*path, str(key)]))
            first_line[key] = line
            _refuse_duplicate_keys(loader, value_node, [*path, str(key)], seen)


def _parse_json(data: bytes) -> Any:
    """The stdlib's JSON load, refusing an object that has a key twice (it keeps the last value, so
    the other would be dropped unseen); the error names the object's path in the document."""
    twice: list[tuple[dict[str, Any], str]] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        built = dict(items)
        if len(built) < len(items) and not twice:
            keys = [key for key, _ in items]
            twice.append((built, next(key for key in keys if keys.count(key) > 1)))
        return built

    document = json.loads(data, object_pairs_hook=pairs)
    if twice:
        where, key = twice[0]
        raise SpecError(f"the key {key!r} is written twice in one object; only one value would be kept: "
                        "remove one of them", path="/".join([*_path_of(document, where, []), key]))
    return document


def _path_of(value: Any, wanted: object, path: list[str]) -> list[str]:
    """The keys and indexes from ``value`` down to the object ``wanted`` (``[]`` if it is not in it)."""
    if value is wanted:
        return path
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for name, child in children:
        found = _path_of(child, wanted, [*path, str(name)])
        if found:  # never empty when found below the top
            return found
    return []


def _parse_yson(data: bytes) -> Any:
    import yt.yson
    from yt.yson.convert import yson_to_json

    stripped = data.strip()
    yson_type = None if stripped.startswith(b"{") else "map_fragment"
    parsed = yt.yson.loads(stripped, yson_type=yson_type)
    return _plain(yson_to_json(parsed))


def _plain(value: Any) -> Any:
    """Turn ``yson_to_json`` output (which may keep ``YsonString`` bytes subclasses) into str/int/..."""
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8")
    return value


def _one_line(error: BaseException) -> str:
    """The parser's whole message (it carries the line and column) on one line."""
    text = " ".join(str(error).split()).replace('in "<byte string>", ', "").replace("in \"<unicode string>\", ", "")
    text = text.split(" ***** ")[0]  # yt.yson appends "Details: ... origin <host> on <time>"
    return text or type(error).__name__
