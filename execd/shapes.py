"""The machinery of execd's wire shapes: type checks of decoded JSON and the two errors.

``protocol.py`` declares the shapes; this module checks values against a shape's
annotations (``check``), builds an answer shape from a decoded body or raises
(``answer``), and turns a shape into its JSON object (``as_json``). Python 3.8,
standard library only, like the rest of execd.

Rule a reader must not break: ``answer`` never guesses - a missing field or a value of
another type raises ``ProtocolError`` naming the route and the field.
"""

from typing import Any, Dict, List, Tuple, Type, TypeVar, Union

T = TypeVar("T")
Json = Dict[str, Any]


class ProtocolError(ValueError):
    """An answer of a shape the protocol does not declare (``field`` "" = the whole body)."""

    def __init__(self, route: str, field: str, problem: str) -> None:
        super().__init__("execd %s answered an unexpected shape: %s" % (route, problem))
        self.route = route
        self.field = field
        self.problem = problem


class FieldError(Exception):
    """A value does not have its declared type (``sentence`` is the client-facing text)."""

    def __init__(self, field: str, sentence: str) -> None:
        super().__init__(sentence)
        self.field = field
        self.sentence = sentence


_NUMBER = (int, float)


def check(name: str, value: Any, kind: Any) -> Any:
    """Return ``value`` if it has the declared type (Optional/Union/List/Dict understood).

    Raises ``FieldError``; a bool is never a number, an int is accepted as a float.
    """
    origin = getattr(kind, "__origin__", None)
    args: Tuple[Any, ...] = getattr(kind, "__args__", ())
    if origin is Union:
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        for kind_option in inner[:-1]:
            try:
                return check(name, value, kind_option)
            except FieldError:
                pass
        return check(name, value, inner[-1])
    if origin in (list, List):
        if not isinstance(value, list):
            raise FieldError(name, "%s must be a list" % name)
        return [check("%s[%d]" % (name, i), v, args[0]) for i, v in enumerate(value)]
    if origin in (dict, Dict):
        if not isinstance(value, dict):
            raise FieldError(name, "%s must be an object" % name)
        return {k: check("%s.%s" % (name, k), v, args[1]) for k, v in value.items()}
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, _NUMBER):
            raise FieldError(name, "%s must be a number" % name)
        return float(value)
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise FieldError(name, "%s must be an integer" % name)
        return value
    if kind is bool:
        if not isinstance(value, bool):
            raise FieldError(name, "%s must be true or false" % name)
        return value
    if kind is str:
        if not isinstance(value, str):
            raise FieldError(name, "%s must be a string" % name)
        return value
    if kind is Any:
        return value
    raise TypeError("unsupported wire type %r" % (kind,))


def answer(cls: Type[T], route: str, obj: Any) -> T:
    """Build answer shape ``cls`` from a decoded JSON answer of ``route``, or raise."""
    if not isinstance(obj, dict):
        raise ProtocolError(route, "", "the answer is not a JSON object")
    kinds = cls.__annotations__
    defaults = cls._field_defaults  # type: ignore[attr-defined]
    values = {}
    for name in cls._fields:  # type: ignore[attr-defined]
        if name in obj:
            try:
                values[name] = check(name, obj[name], kinds[name])
            except FieldError as e:
                raise ProtocolError(route, e.field, e.sentence) from None
        elif name not in defaults:
            raise ProtocolError(route, name, "the field %r is missing" % name)
    return cls(**values)


def as_json(shape: Any) -> Json:
    """A shape's JSON object: every field, except optional ones that are None."""
    return {k: v for k, v in shape._asdict().items() if v is not None}
