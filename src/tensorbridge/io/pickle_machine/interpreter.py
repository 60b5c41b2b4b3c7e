"""The pickle machine's interpreter: protocol 0-5 opcodes over bytes, bounded in work.

:func:`unpickle` runs a pickle's instructions over bytes in memory, every length
checked against the bytes left; each global is resolved against :mod:`.table` (a
value constructor, a constant, a placeholder, or a refusal), so nothing a file names
is imported or called. The work budget (:data:`WORK_PER_BYTE`, :data:`WORK_BASE`),
the nesting limit (:data:`MAX_DEPTH`) and the walk of the result
(:func:`_check_result`) keep time and memory linear in the input. The promises are
listed in :mod:`tensorbridge.io.pickle_machine`.
"""

from __future__ import annotations

import re
import struct
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from ...errors import FormatError
from .rebuilds import CONSTANTS, PLAIN_TENSOR_TYPES
from .table import RENAMED, TABLE, plain_attributes, refused
from .values import DICTS, Global, Opaque, TensorRef

__all__ = ["MAX_DEPTH", "MAX_LONG_BYTES", "WORK_BASE", "WORK_PER_BYTE", "unpickle", "unpickle_at"]

MAX_DEPTH = 200  # containers nested deeper than this are no checkpoint's
WORK_PER_BYTE = 16  # the work budget: units (about a byte of memory each) per pickle byte ...
WORK_BASE = 1 << 20  # ... plus this, for any pickle
MAX_LONG_BYTES = 1024  # a LONG4 integer wider than this (2,466 digits) is no checkpoint's


_ESCAPES = {b"\\": b"\\", b"'": b"'", b'"': b'"', b"a": b"\a", b"b": b"\b", b"f": b"\f",
            b"n": b"\n", b"r": b"\r", b"t": b"\t", b"v": b"\v", b"\n": b""}  # fmt: skip
_ESCAPE = re.compile(rb"\\(x[0-9a-fA-F]{2}|[0-7]{1,3}|[\s\S]?)")


def _unescape(text: bytes) -> bytes:
    """A protocol-0 STRING's escapes, as Python 2 wrote them (``codecs.escape_decode``
    without its warning: an unknown escape such as ``\\q`` stays as it is)."""

    def one(m: re.Match[bytes]) -> bytes:
        e = m.group(1)
        if e in (b"", b"x"):
            raise FormatError("a STRING instruction with an unfinished escape")
        if len(e) == 3 and e[:1] == b"x":
            return bytes([int(e[1:], 16)])
        if e[:1] in b"01234567" and e[:1]:
            return bytes([int(e, 8) & 0xFF])
        if e not in _ESCAPES:
            return b"\\" + e
        return _ESCAPES[e]

    return _ESCAPE.sub(one, text)


_MARK = object()


def unpickle(
    data: bytes,
    *,
    persistent_load: Callable[[Any], Any] | None = None,
    placeholders: bool | frozenset[str] = True,
    start: int = 0,
) -> Any:
    """The value a pickle in ``data`` describes, built by the table and placeholders only.

    Args:
        data: the pickle (bytes in memory: every length is checked against them).
        persistent_load: given each persistent id (a plain tuple), returns the value it
            stands for (a :class:`StorageRef`); ``None``: a persistent id is refused.
        placeholders: ``True``: a global outside the table and :data:`REFUSED` becomes an
            :class:`Opaque`; a set of dotted names: only those do; ``False``: none.
        start: where the pickle starts in ``data``.

    Returns:
        The value. :func:`unpickle_at` also gives where the pickle ended.

    Raises:
        FormatError: anything else: a global refused, an instruction aimed at an object
            the run did not create, a length past the end, nesting too deep, a malformed
            stream.
    """
    return unpickle_at(
        data, persistent_load=persistent_load, placeholders=placeholders, start=start
    )[0]


def unpickle_at(
    data: bytes,
    *,
    persistent_load: Callable[[Any], Any] | None = None,
    placeholders: bool | frozenset[str] = True,
    start: int = 0,
) -> tuple[Any, int]:
    """:func:`unpickle`, and the offset just past the pickle's ``STOP``."""
    try:
        value, end = _run(data, start, persistent_load, placeholders)
    except FormatError:
        raise
    except IndexError:
        raise FormatError("the pickle is malformed (it takes from an empty stack)") from None
    except (
        KeyError, TypeError, ValueError, struct.error, OverflowError, UnicodeDecodeError,
        RecursionError, AttributeError,
    ) as err:  # fmt: skip
        raise FormatError(f"the pickle is malformed ({type(err).__name__}: {err})") from None
    _check_result(value, 16 * (end - start) + 4096)
    return value, end


def _run(
    data: bytes,
    start: int,
    persistent_load: Callable[[Any], Any] | None,
    placeholders: bool | frozenset[str],
) -> tuple[Any, int]:
    """Run the opcodes of the pickle at ``data[start:]``: its value and where it ended.

    One loop over every opcode, long on purpose: each branch is a few lines that read
    the operands, check them against the bytes left and the work budget, and push or
    pop; a function per opcode would add a call to every step of the hot loop and
    spread one stack machine's invariants over sixty functions.
    """
    end, pos = len(data), start
    stack: list[Any] = []
    metastack: list[list[Any]] = []
    memo: dict[int, Any] = {}
    depth: dict[int, int] = {}  # id(tuple or frozenset) -> nesting, for hashing's sake
    keep: list[Any] = []  # keeps those ids alive for the run
    unpack = struct.unpack_from
    budget = WORK_PER_BYTE * (end - pos) + WORK_BASE
    work = 0

    def charge(n: int) -> None:
        """Count work the stream's bytes do not pay for one by one: a container made (its
        size in bytes), a constructor's argument read (8 a value, 1 a character)."""
        nonlocal work
        work += n
        if work > budget:
            raise FormatError(
                f"the pickle asks for over {budget:,} units of work ({WORK_PER_BYTE} per byte "
                f"of its {end - start:,} plus {WORK_BASE:,}; a unit is about a byte of memory "
                "made or read): no checkpoint does"
            )

    def take(n: int) -> int:
        nonlocal pos
        if n < 0 or n > end - pos:
            raise FormatError(
                f"the pickle claims {n:,} bytes at offset {pos:,} where {end - pos:,} remain"
            )
        at = pos
        pos += n
        return at

    def line() -> bytes:
        nonlocal pos
        nl = data.find(b"\n", pos)
        if nl < 0:
            raise FormatError("the pickle ends inside a text instruction")
        out = bytes(data[pos:nl])
        pos = nl + 1
        return out

    def pop_mark() -> list[Any]:
        nonlocal stack
        items = stack
        stack = metastack.pop()
        return items

    def frozen(t: Any, items: Any) -> Any:
        """Record how deep a tuple or frozenset nests: hashing one recurses in C."""
        d = 0
        for x in items:
            if type(x) is tuple or type(x) is frozenset:
                d = max(d, depth.get(id(x), 0))
        if d >= MAX_DEPTH:
            raise FormatError(f"tuples nested over {MAX_DEPTH} deep; no checkpoint is")
        if d:
            depth[id(t)] = d + 1
            keep.append(t)
        return t

    def resolve(module: str, name: str) -> Any:
        if type(module) is not str or type(name) is not str:
            raise FormatError("STACK_GLOBAL given something other than two strings")
        module = RENAMED.get(module, module)
        dotted = f"{module}.{name}"
        if dotted in CONSTANTS:
            return CONSTANTS[dotted]
        if dotted in TABLE:
            return Global(dotted)
        if placeholders is True:  # a refused one is refused when called, not when named
            return Opaque(dotted)
        if isinstance(placeholders, frozenset) and dotted in placeholders:
            return Opaque(dotted)
        if refused(dotted) or dotted in PLAIN_TENSOR_TYPES:
            return Global(dotted)  # refused when called or left in the result
        raise FormatError(f"the global {dotted} is not one this file may hold")

    def call(fn: Any, args: Any, how: str) -> Any:
        if type(args) is not tuple:
            raise FormatError(f"{how} given arguments that are not a tuple")
        if isinstance(fn, Global):
            build = TABLE.get(fn.name)
            if build is None:
                raise FormatError(f"the file calls {fn.name}, which tensorbridge never calls")
            charge(64 + sum(8 * len(a) if type(a) in (list, tuple) else len(a) if type(a) in
                            (str, bytes) else 8 for a in args))  # fmt: skip
            return build(args)
        if isinstance(fn, Opaque):
            listed = isinstance(placeholders, frozenset) and fn.name in placeholders
            if refused(fn.name) and not listed:
                raise FormatError(f"the file calls {fn.name}, which tensorbridge never calls")
            return Opaque(fn.name, args)
        raise FormatError(f"{how} of a {type(fn).__name__}, which is not a global")

    def build(obj: Any, state: Any) -> None:
        if isinstance(obj, Opaque) and obj.args is None:
            raise FormatError(f"BUILD aimed at {obj.name} itself, a class the file names")
        if isinstance(obj, Opaque):
            object.__setattr__(obj, "state", state)
        elif type(obj) is OrderedDict and type(state) is dict and plain_attributes(state):
            obj.__dict__.update(state)  # a state dict's _metadata: module versions
        elif type(obj) in DICTS or isinstance(obj, TensorRef):
            # a dict's or a tensor's attributes: not data, dropped
            if state is not None and type(state) not in (dict, tuple):
                raise FormatError(f"BUILD of a {type(obj).__name__} with a {type(state).__name__}")
        else:
            raise FormatError(
                f"BUILD aimed at a {type(obj).__name__} (only objects the file built may be)"
            )

    def setitems(target: Any, items: list[Any]) -> None:
        if len(items) % 2:
            raise FormatError("SETITEMS given an odd number of items")
        if type(target) in DICTS:
            for i in range(0, len(items), 2):
                target[items[i]] = items[i + 1]
        elif isinstance(target, Opaque) and target.args is not None:
            target.items.extend(zip(items[::2], items[1::2], strict=True))
        else:
            raise FormatError(f"SETITEM aimed at a {type(target).__name__}")

    def appends(target: Any, items: list[Any]) -> None:
        if type(target) is list:
            target.extend(items)
        elif isinstance(target, Opaque) and target.args is not None:
            target.listitems.extend(items)
        else:
            raise FormatError(f"APPEND aimed at a {type(target).__name__}")

    while True:
        if pos >= end:
            raise FormatError("the pickle ends before its STOP instruction")
        op = data[pos]
        pos += 1
        if op == 0x71:  # BINPUT
            memo[data[take(1)]] = stack[-1]
        elif op == 0x68:  # BINGET
            stack.append(memo[data[take(1)]])
        elif op == 0x58:  # BINUNICODE
            (n,) = unpack("<I", data, take(4))
            at = take(n)
            stack.append(str(data[at : at + n], "utf-8", "surrogatepass"))
        elif op == 0x8C:  # SHORT_BINUNICODE
            n = data[take(1)]
            at = take(n)
            stack.append(str(data[at : at + n], "utf-8", "surrogatepass"))
        elif op == 0x94:  # MEMOIZE
            memo[len(memo)] = stack[-1]
        elif op == 0x28:  # MARK
            charge(64)
            metastack.append(stack)
            stack = []
        elif op == 0x4B:  # BININT1
            stack.append(data[take(1)])
        elif op == 0x74:  # TUPLE
            items = pop_mark()
            stack.append(frozen(tuple(items), items))
        elif op == 0x85:  # TUPLE1
            stack[-1] = frozen((stack[-1],), stack[-1:])
        elif op == 0x86:  # TUPLE2
            t = (stack[-2], stack[-1])
            del stack[-2:]
            stack.append(frozen(t, t))
        elif op == 0x87:  # TUPLE3
            t3 = (stack[-3], stack[-2], stack[-1])
            del stack[-3:]
            stack.append(frozen(t3, t3))
        elif op == 0x29:  # EMPTY_TUPLE
            stack.append(())
        elif op == 0x52:  # REDUCE
            args = stack.pop()
            stack[-1] = call(stack[-1], args, "REDUCE")
        elif op == 0x81:  # NEWOBJ
            args = stack.pop()
            stack[-1] = call(stack[-1], args, "NEWOBJ")
        elif op == 0x92:  # NEWOBJ_EX
            kwargs = stack.pop()
            args = stack.pop()
            cls = stack[-1]
            if not isinstance(cls, Opaque) or type(kwargs) is not dict or refused(cls.name):
                raise FormatError("NEWOBJ_EX of something that is no placeholder class")
            stack[-1] = Opaque(cls.name, args if type(args) is tuple else (args,), kwargs=kwargs)
        elif op == 0x88:  # NEWTRUE
            stack.append(True)
        elif op == 0x89:  # NEWFALSE
            stack.append(False)
        elif op == 0x4E:  # NONE
            stack.append(None)
        elif op == 0x51:  # BINPERSID
            pid = stack.pop()
            if persistent_load is None:
                raise FormatError("a persistent id where none belongs")
            stack.append(persistent_load(pid))
        elif op == 0x50:  # PERSID
            pid = line().decode("ascii")
            if persistent_load is None:
                raise FormatError("a persistent id where none belongs")
            stack.append(persistent_load(pid))
        elif op == 0x75:  # SETITEMS
            items = pop_mark()
            setitems(stack[-1], items)
        elif op == 0x73:  # SETITEM
            value = stack.pop()
            key = stack.pop()
            setitems(stack[-1], [key, value])
        elif op == 0x7D:  # EMPTY_DICT
            charge(64)
            stack.append({})
        elif op == 0x5D:  # EMPTY_LIST
            charge(56)
            stack.append([])
        elif op == 0x61:  # APPEND
            value = stack.pop()
            appends(stack[-1], [value])
        elif op == 0x65:  # APPENDS
            items = pop_mark()
            appends(stack[-1], items)
        elif op == 0x62:  # BUILD
            state = stack.pop()
            build(stack[-1], state)
        elif op == 0x63:  # GLOBAL
            module = line().decode("utf-8")
            name = line().decode("utf-8")
            stack.append(resolve(module, name))
        elif op == 0x93:  # STACK_GLOBAL
            name = stack.pop()
            module = stack.pop()
            stack.append(resolve(module, name))
        elif op == 0x72:  # LONG_BINPUT
            (i,) = unpack("<I", data, take(4))
            memo[i] = stack[-1]
        elif op == 0x6A:  # LONG_BINGET
            (i,) = unpack("<I", data, take(4))
            stack.append(memo[i])
        elif op == 0x4D:  # BININT2
            (i,) = unpack("<H", data, take(2))
            stack.append(i)
        elif op == 0x4A:  # BININT
            (i,) = unpack("<i", data, take(4))
            stack.append(i)
        elif op == 0x8A:  # LONG1
            n = data[take(1)]
            at = take(n)
            stack.append(int.from_bytes(data[at : at + n], "little", signed=True))
        elif op == 0x8B:  # LONG4
            (n,) = unpack("<i", data, take(4))
            at = take(n)  # the bytes must be there; then their width is checked
            if n > MAX_LONG_BYTES:
                raise FormatError(
                    f"an integer of {n:,} bytes (LONG4); tensorbridge reads integers of at most "
                    f"{MAX_LONG_BYTES:,} bytes, and no checkpoint holds a wider one"
                )
            stack.append(int.from_bytes(data[at : at + n], "little", signed=True))
        elif op == 0x47:  # BINFLOAT
            (x,) = unpack(">d", data, take(8))
            stack.append(x)
        elif op == 0x8D:  # BINUNICODE8
            (n,) = unpack("<Q", data, take(8))
            at = take(n)
            stack.append(str(data[at : at + n], "utf-8", "surrogatepass"))
        elif op in (0x42, 0x43, 0x8E, 0x96):  # BINBYTES, SHORT_BINBYTES, BINBYTES8, BYTEARRAY8
            fmt = {0x42: "<I", 0x43: "<B", 0x8E: "<Q", 0x96: "<Q"}[op]
            (n,) = unpack(fmt, data, take(struct.calcsize(fmt)))
            at = take(n)
            stack.append(bytes(data[at : at + n]))
        elif op in (0x54, 0x55):  # BINSTRING, SHORT_BINSTRING (Python 2 str: utf-8, as torch)
            fmt = "<i" if op == 0x54 else "<B"
            (n,) = unpack(fmt, data, take(struct.calcsize(fmt)))
            at = take(n)
            stack.append(str(data[at : at + n], "utf-8"))
        elif op == 0x95:  # FRAME: the bytes are all here already
            (n,) = unpack("<Q", data, take(8))
            if n > end - pos:
                raise FormatError(f"a pickle frame claims {n:,} bytes where {end - pos:,} remain")
        elif op == 0x80:  # PROTO
            if data[take(1)] > 5:
                raise FormatError(f"pickle protocol {data[pos - 1]} is newer than any known")
        elif op == 0x8F:  # EMPTY_SET
            charge(216)
            stack.append(set())
        elif op == 0x90:  # ADDITEMS
            items = pop_mark()
            if type(stack[-1]) is not set:
                raise FormatError(f"ADDITEMS aimed at a {type(stack[-1]).__name__}")
            stack[-1].update(items)
        elif op == 0x91:  # FROZENSET
            items = pop_mark()
            stack.append(frozen(frozenset(items), items))
        elif op == 0x2E:  # STOP
            if len(stack) != 1 or metastack:
                raise FormatError("the pickle stops with other than one value on its stack")
            return stack[0], pos
        elif op == 0x30:  # POP
            if stack:
                stack.pop()
            else:
                pop_mark()
        elif op == 0x31:  # POP_MARK
            pop_mark()
        elif op == 0x32:  # DUP
            stack.append(stack[-1])
        elif op == 0x49:  # INT (protocol 0; "01" / "00" are True / False)
            text = line()
            stack.append(True if text == b"01" else False if text == b"00" else int(text))
        elif op == 0x4C:  # LONG (protocol 0)
            stack.append(int(line().rstrip(b"L")))
        elif op == 0x46:  # FLOAT (protocol 0)
            stack.append(float(line()))
        elif op == 0x53:  # STRING (protocol 0: a quoted, escaped Python 2 str)
            text = line().rstrip()
            if len(text) < 2 or text[0] != text[-1] or text[:1] not in (b"'", b'"'):
                raise FormatError("a STRING instruction without quotes")
            stack.append(str(_unescape(text[1:-1]), "utf-8"))
        elif op == 0x56:  # UNICODE (protocol 0)
            stack.append(str(line(), "raw-unicode-escape"))
        elif op == 0x67:  # GET
            stack.append(memo[int(line())])
        elif op == 0x70:  # PUT
            i = int(line())
            if i < 0:
                raise FormatError("a negative memo index")
            memo[i] = stack[-1]
        elif op == 0x64:  # DICT
            items = pop_mark()
            d: dict[Any, Any] = {}
            setitems(d, items)
            stack.append(d)
        elif op == 0x6C:  # LIST
            items = pop_mark()
            stack.append(items)
        elif op == 0x69:  # INST
            module = line().decode("utf-8")
            name = line().decode("utf-8")
            args = tuple(pop_mark())
            stack.append(call(resolve(module, name), frozen(args, args), "INST"))
        elif op == 0x6F:  # OBJ
            items = pop_mark()
            if not items:
                raise FormatError("OBJ without a class")
            args = tuple(items[1:])
            stack.append(call(items[0], frozen(args, args), "OBJ"))
        else:
            known = {0x82: "EXT1", 0x83: "EXT2", 0x84: "EXT4", 0x97: "NEXT_BUFFER",
                     0x98: "READONLY_BUFFER"}  # fmt: skip
            what = known.get(op, f"the unknown opcode 0x{op:02x}")
            raise FormatError(
                f"the pickle uses {what} at offset {pos - 1}, which no checkpoint does"
            )


def _children(obj: Any) -> Any:
    t = type(obj)
    if t is list or t is tuple or t is set or t is frozenset:
        return obj
    if t is dict or t is OrderedDict:
        kids = [x for kv in obj.items() for x in kv]
        return [*kids, obj.__dict__] if t is OrderedDict and obj.__dict__ else kids
    if t is Opaque:
        return [obj.args, obj.state, obj.kwargs, obj.items, obj.listitems]
    return ()


def _check_result(root: Any, budget: int) -> None:
    """Walk the result once, iteratively: no token left, no cycle, at most MAX_DEPTH deep,
    and at most ``budget`` values when shared references are counted each time and text,
    bytes and integers by their length (a walk of the result as a tree, as flattening and
    rendering metadata do, must stay linear in the input)."""
    if isinstance(root, Global):
        raise FormatError(f"the file holds the global {root.name} itself; no checkpoint does")
    size: dict[int, int] = {}  # id -> values beneath, counted as a tree
    active: set[int] = set()
    stack: list[tuple[Any, Any, int]] = [(root, iter(_children(root)), 1)]
    active.add(id(root))
    while stack:
        obj, it, total = stack[-1]
        for child in it:
            if isinstance(child, Global):
                raise FormatError(
                    f"the file holds the global {child.name} itself; no checkpoint does"
                )
            kids = _children(child)
            if not kids:
                t = type(child)  # text and bytes by length: a reader renders each reference
                total += (
                    1 + len(child) if t is str or t is bytes
                    else 1 + child.bit_length() // 8 if t is int else 1
                )  # fmt: skip
                if total > budget:
                    raise FormatError(
                        f"the pickle's shared references expand to over {budget:,} values "
                        "(text and bytes counted by length); no checkpoint's do"
                    )
                continue
            done = size.get(id(child))
            if done is not None:
                total += done
                if total > budget:
                    raise FormatError(
                        f"the pickle's shared references expand to over {budget:,} values; "
                        "no checkpoint's do"
                    )
                continue
            if id(child) in active:
                raise FormatError("a container holds itself; no checkpoint does")
            if len(stack) >= MAX_DEPTH:
                raise FormatError(f"containers nested over {MAX_DEPTH} deep; no checkpoint is")
            stack[-1] = (obj, it, total)
            active.add(id(child))
            stack.append((child, iter(kids), 1))
            break
        else:
            stack.pop()
            active.discard(id(obj))
            size[id(obj)] = total
            if stack:
                parent, pit, ptotal = stack[-1]
                stack[-1] = (parent, pit, ptotal + total)
