"""Read a Spec or DynamicSpec file into plain Python data, the format chosen by extension.

``.yson`` is parsed by ytsaurus-client's ``yt.yson`` (both a whole map and Flow's map fragment
``"computations" = {...};`` load), ``.yaml``/``.yml`` by PyYAML, ``.json`` by the stdlib. In each,
a key written twice in one map is refused naming its path and both places, and so is a byte that
is not UTF-8, naming its line and column.
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
    _refuse_non_utf8(data)
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


_UTF16_OR_32 = (b"\xff\xfe", b"\xfe\xff", b"\x00\x00\xfe\xff")
"""The byte order marks of UTF-16 and UTF-32, which the YAML and JSON parsers read too."""


def _refuse_non_utf8(data: bytes) -> None:
    """Raise :class:`SpecError` naming the line, the column and the value of the first byte of
    ``data`` that is not UTF-8 (each parser would name only its position in the file, or, for
    YSON, its position in a string). A file with a UTF-16 or UTF-32 byte order mark is left to the
    parser."""
    if data.startswith(_UTF16_OR_32):
        return
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as error:
        line_start = data.rfind(b"\n", 0, error.start) + 1
        line, column = data.count(b"\n", 0, error.start) + 1, error.start - line_start + 1
        raise SpecError(f"the byte 0x{data[error.start]:02x} at line {line}, column {column} (byte "
                        f"{error.start + 1} of the file) is not UTF-8: save the file as UTF-8") from None


def _written_twice(key: Any, first: tuple[int, int], second: tuple[int, int]) -> str:
    """The message for ``key`` written twice in one map, at ``first`` and ``second`` (1-based
    line and column each): both places, so that the reader finds them, and the fix."""
    (line, column), (other_line, other_column) = first, second
    where = (f"line {line}, columns {column} and {other_column}" if line == other_line
             else f"lines {line} and {other_line}")
    return f"the key {key!r} is written twice ({where}); only one value would be kept: remove one of them"


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
        first: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue  # a "<<" merge key's entries may be overridden: that is what it is for
            # A plain string key is its text: the constructor's call costs more than the rest here.
            key = key_node.value if key_node.tag == _YAML_STR else loader.construct_object(key_node)
            if key in first:
                raise SpecError(_written_twice(key, _yaml_place(first[key]), _yaml_place(key_node)),
                                path="/".join([*path, str(key)]))
            first[key] = key_node
            if not isinstance(value_node, yaml.ScalarNode):
                _refuse_duplicate_keys(loader, value_node, [*path, str(key)], seen)


_YAML_STR = "tag:yaml.org,2002:str"


def _yaml_place(node: Any) -> tuple[int, int]:
    """The line and column (1-based) where the composed YAML ``node`` starts."""
    return node.start_mark.line + 1, node.start_mark.column + 1


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
    """yt.yson's pure-Python parser, which refuses a map key or an attribute written twice: named
    rather than ``yt.yson.loads``, which is the C++ bindings' when those are installed, whose
    handling of a key twice this loader does not rely on. Its message names neither the map nor
    the lines: a file it refuses so is walked again (:func:`_yson_duplicate`) to say both."""
    from yt.yson.common import YsonError
    from yt.yson.convert import yson_to_json
    from yt.yson.parser import loads

    stripped = data.strip()
    fragment = not stripped.startswith(b"{")
    try:
        parsed = loads(stripped, yson_type="map_fragment" if fragment else None)
    except YsonError as error:
        if "Duplicate map key" in str(error) or "Repeated attribute" in str(error):
            found = _yson_duplicate(data, fragment)  # not stripped: its lines are the file's
            if found is not None:
                raise found from None
        raise
    return _plain(yson_to_json(parsed))


def _yson_duplicate(data: bytes, fragment: bool) -> SpecError | None:
    """The first key written twice in one map (or one attribute map, ``@`` in the path) of the
    YSON ``data`` (a map fragment when ``fragment``), as a :class:`SpecError` naming its path and
    both places; ``None`` when there is none. Walks yt.yson's tokens, keeping the path: a
    container opened, a key read, a ``;`` between entries, a container closed."""
    from io import BytesIO

    from yt.yson import yson_token as token
    from yt.yson.tokenizer import YsonTokenizer

    source = b"{" + data + b"}" if fragment else data
    tokens = YsonTokenizer(BytesIO(source), encoding="utf-8")
    # Each open container: its path, its keys' places (None for a list), the next entry's key or index.
    stack: list[tuple[list[str], dict[str, tuple[int, int]] | None, list[str]]] = []
    expect_key = False
    while True:
        tokens.parse_next()
        kind = tokens.get_current_token().get_type()
        if kind == token.TOKEN_END_OF_STREAM:
            return None
        here = [*stack[-1][0], stack[-1][2][0]] if stack else []
        if kind in (token.TOKEN_LEFT_BRACE, token.TOKEN_LEFT_ANGLE):
            stack.append(([*here, "@"] if kind == token.TOKEN_LEFT_ANGLE else here, {}, [""]))
            expect_key = True
        elif kind == token.TOKEN_LEFT_BRACKET:
            stack.append((here, None, ["0"]))
        elif kind in (token.TOKEN_RIGHT_BRACE, token.TOKEN_RIGHT_ANGLE, token.TOKEN_RIGHT_BRACKET):
            stack.pop()
            expect_key = False
        elif kind == token.TOKEN_SEMICOLON and stack:
            path, keys, entry = stack[-1]
            if keys is None:
                entry[0] = str(int(entry[0]) + 1)
            expect_key = keys is not None
        elif kind == token.TOKEN_STRING and expect_key and stack:
            path, keys, entry = stack[-1]
            key = str(tokens.get_current_token().get_value())
            at = _yson_place(source, tokens.get_position_info(), fragment)
            if keys is not None and key in keys:
                return SpecError(_written_twice(key, keys[key], at), path="/".join([*path, key]))
            if keys is not None:
                keys[key] = at
            entry[0], expect_key = key, False


def _yson_place(source: bytes, position: tuple[int, int, int], fragment: bool) -> tuple[int, int]:
    """The line and column (1-based) where the key token that ends at ``position`` (yt.yson's
    line, column after it, offset after it) starts in the file; a fragment's added ``{`` is not in
    the file."""
    line, _, offset = position
    start = offset - 1
    if source[start:offset] == b'"':  # a quoted key: back to its opening quote
        start -= 1
        while start > 0 and not (source[start:start + 1] == b'"' and source[start - 1:start] != b"\\"):
            start -= 1
    else:
        while start > 0 and source[start - 1:start] not in b" \t\r\n{;<":
            start -= 1
    column = start - (source.rfind(b"\n", 0, start) + 1) + 1
    return line, column - 1 if fragment and line == 1 else column


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
