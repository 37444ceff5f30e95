"""Reading a YAML document fast: what ``yaml.safe_load`` returns, in a fraction of its time.

A cluster spec of 16,384 devices is some 60,000 YAML nodes. ``yaml.safe_load``
scans and parses them in pure Python and then builds each value through
PyYAML's generic constructor (two-phase, for recursive documents); the two
took about 4 s of the 4.5 s ``hetsched plan --cluster`` spent on such a spec.
Here libyaml (``yaml.CSafeLoader``, when PyYAML was built with it; the Python
parser otherwise) composes the node graph and the plain maps, lists and strings a
spec consists of are built directly from it. Anything else (merge keys ``<<``,
non-string keys, explicit tags such as ``!!set``, a recursive alias) goes through
PyYAML's own constructor for the whole document, so every document loads to what
``yaml.safe_load`` gives it and fails with the same ``yaml.YAMLError`` at the same
line (libyaml words some messages differently). One difference: an explicitly
tagged scalar PyYAML cannot read (``count: !!int nope``), where ``yaml.safe_load``
raises a bare ``ValueError``, is a ``yaml.YAMLError`` naming its line.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import yaml  # type: ignore[import-untyped, unused-ignore]
from yaml.constructor import ConstructorError  # type: ignore[import-untyped, unused-ignore]
from yaml.nodes import (  # type: ignore[import-untyped, unused-ignore]
    MappingNode,
    Node,
    ScalarNode,
    SequenceNode,
)

_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's parser where PyYAML was built with it (six times faster than the Python
one); both resolve and construct with the same Python classes."""
_STR = "tag:yaml.org,2002:str"
_MAP = "tag:yaml.org,2002:map"
_SEQ = "tag:yaml.org,2002:seq"


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """No cyclic garbage collection inside (the previous state is restored after).

    Building a big document allocates hundreds of thousands of containers, and each
    few hundred start a collection pass that walks the young ones and, as they age,
    the whole growing document: about a third of the time of reading a
    16,384-device spec. What is built is acyclic, so a pass finds nothing to free.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


_MALFORMED = (ValueError, TypeError, AttributeError, LookupError)
"""What PyYAML's int, float, bool and timestamp constructors raise, instead of a
``yaml.YAMLError``, on an explicitly tagged scalar they cannot read (``!!int nope``)."""


def _scalar(loader: yaml.SafeLoader, node: ScalarNode) -> Any:
    """A scalar that is not a string, built by the loader's constructor."""
    try:
        return loader.construct_object(node)
    except _MALFORMED as exc:
        problem = f"cannot read {node.value!r} as {node.tag}"
        raise ConstructorError(None, None, problem, node.start_mark) from exc


class _NotPlain(Exception):
    """The document needs PyYAML's own constructor."""


def load_yaml(text: str) -> Any:
    """The document in ``text``, equal to ``yaml.safe_load(text)``; raises ``yaml.YAMLError``.

    >>> load_yaml("nodes: [{name: a, devices: [{type: T4-16GB, count: 2}]}]")
    {'nodes': [{'name': 'a', 'devices': [{'type': 'T4-16GB', 'count': 2}]}]}
    """
    loader = _LOADER(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        try:
            return _plain(loader, node, {})
        except _NotPlain:
            pass
        try:
            return loader.construct_document(node)
        except _MALFORMED as exc:
            raise ConstructorError(None, None, f"cannot build the document: {exc}") from exc
    finally:
        loader.dispose()


def _plain(loader: yaml.SafeLoader, node: Node, built: dict[int, Any]) -> Any:
    """``node`` as Python values, if it is made of plain maps, lists and scalars.

    ``built`` maps each map or list node already built (an alias shares its
    node) to its value, or to ``built`` itself while its children are built, which
    is how an alias of an enclosing node (a recursive document) is told apart.
    """
    kind = type(node)
    if kind is ScalarNode:
        # Strings as PyYAML's str constructor returns them; numbers, booleans, nulls,
        # timestamps through the loader's own constructor.
        return node.value if node.tag == _STR else _scalar(loader, node)
    done = built.get(id(node))
    if done is not None:
        if done is built:
            raise _NotPlain
        return done
    built[id(node)] = built
    value: Any
    if kind is MappingNode and node.tag == _MAP:
        value = {}
        for key_node, value_node in node.value:
            # Only string keys: PyYAML rewrites merge (``<<``) and value (``=``) keys
            # and refuses unhashable ones.
            if type(key_node) is not ScalarNode or key_node.tag != _STR:
                raise _NotPlain
            value[key_node.value] = _plain(loader, value_node, built)
    elif kind is SequenceNode and node.tag == _SEQ:
        value = [_plain(loader, item, built) for item in node.value]
    else:
        raise _NotPlain
    built[id(node)] = value
    return value
