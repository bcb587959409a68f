"""OpGraph: the intermediate representation (tensors + nodes), its validation and ordering.

OpGraph knows nothing of engines. The user-facing :class:`dnntune.Graph` builds on it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Iterable
from functools import partial
from typing import Any

from dnntune.errors import InvalidValueError
from dnntune.graph.json_numbers import finite_float, short_repr
from dnntune.graph.layout_checks import byte_size_problem, overlap, scalar_value_problem
from dnntune.graph.node import Node
from dnntune.graph.ops import spec_for
from dnntune.graph.ops.base import NodeError
from dnntune.graph.tensor import TensorAttributes
from dnntune.graph.types import INT64_RANGE, DataType, check_data_type

__all__ = ["OpGraph", "TensorError"]

#: data types a pass-by-value scalar can carry in hipDNN's JSON (``value_type``)
SCALAR_TYPES = frozenset(
    {
        DataType.FLOAT,
        DataType.HALF,
        DataType.BFLOAT16,
        DataType.DOUBLE,
        DataType.INT32,
        DataType.INT64,
    }
)


class TensorError(InvalidValueError):
    """A tensor is wrong; ``tensor`` says which."""

    def __init__(self, tensor: TensorAttributes, problem: str, field: str = "") -> None:
        super().__init__(f"tensor {tensor.name!r} (uid {tensor.uid}): {problem}")
        self.tensor = tensor
        self.field = field
        self.problem = problem


#: what an op may compute in (cuDNN's compute types: a float type, or int32 for integer data)
_COMPUTE_TYPES = frozenset(
    {DataType.FLOAT, DataType.HALF, DataType.BFLOAT16, DataType.DOUBLE, DataType.INT32}
)
_COMPUTE_NAMES = ", ".join(sorted(t.json_name for t in _COMPUTE_TYPES))


class OpGraph:
    """Tensors and nodes of one operation graph, with graph-level data types."""

    def __init__(
        self,
        name: str = "",
        io_data_type: DataType | None = None,
        compute_data_type: DataType | None = None,
        intermediate_data_type: DataType | None = None,
    ) -> None:
        if not isinstance(name, str):
            # JSON names are strings: a graph saved with name=5 did not load back
            raise InvalidValueError(f"graph name must be a string, got {name!r}")
        self.name = name
        self.io_data_type = check_data_type(io_data_type, f"graph {name!r}: io_data_type")
        self.compute_data_type = check_data_type(
            compute_data_type, f"graph {name!r}: compute_data_type"
        )
        self.intermediate_data_type = check_data_type(
            intermediate_data_type, f"graph {name!r}: intermediate_data_type"
        )
        self.tensors: list[TensorAttributes] = []
        self.nodes: list[Node] = []
        self._validated = False
        #: counts tensors and nodes added: plans built for one revision do not run another
        self.revision = 0
        #: the JSON document this graph was loaded from (the writer patches it)
        self.json_source: dict[str, Any] | None = None

    # ---- construction -------------------------------------------------------------------
    def add_tensor(self, tensor: TensorAttributes) -> TensorAttributes:
        """Register a tensor (idempotent for the same object)."""
        if all(tensor is not t for t in self.tensors):
            self.tensors.append(tensor)
            self.revision += 1
        if all(self is not g for g in tensor._graphs):
            tensor._graphs.append(self)
        self._validated = False
        return tensor

    def holds(self, tensor: TensorAttributes) -> bool:
        """True if ``tensor`` is one of this graph's tensors (not one of another graph, even
        with the same uid)."""
        return any(g is self for g in tensor._graphs)

    def note_edit(self) -> None:
        """One of this graph's tensors was edited (its uid, dims, strides, data type, value,
        output or virtual flag, by a setter, an assignment or in place): the graph is validated
        again, and plans made before the edit do not run it."""
        self.revision += 1
        self._validated = False

    def add_node(self, node: Node) -> Node:
        """Append a node and register every tensor it touches."""
        for t in node.tensors():
            self.add_tensor(t)
        self.nodes.append(node)
        self.revision += 1
        self._validated = False
        return node

    def tensor_by_uid(self, uid: int) -> TensorAttributes:
        for t in self.tensors:
            if t.uid == uid:
                return t
        raise InvalidValueError(f"graph {self.name!r} has no tensor with uid {uid}")

    def assign_uids(self) -> None:
        """Give every tensor without a uid the next free one (uids may start at 0)."""
        used = {t.uid for t in self.tensors if t.uid is not None}
        next_uid = 0
        for t in self.tensors:
            if t.uid is None:
                while next_uid in used:
                    next_uid += 1
                t.uid = next_uid
                used.add(next_uid)

    # ---- queries ------------------------------------------------------------------------
    def producers(self) -> dict[int, Node]:
        """Map ``id(tensor)`` to the node that writes it."""
        out: dict[int, Node] = {}
        for node in self.nodes:
            for t in node.outputs.values():
                if t is not None:
                    out[id(t)] = node
        return out

    def input_tensors(self) -> list[TensorAttributes]:
        """Non-virtual tensors read by the graph and written by no node (scalars excluded)."""
        produced = self.producers()
        return [
            t
            for t in self.tensors
            if id(t) not in produced and not t.is_virtual and not t.is_scalar
        ]

    def output_tensors(self) -> list[TensorAttributes]:
        """Non-virtual tensors written by a node."""
        produced = self.producers()
        return [t for t in self.tensors if id(t) in produced and not t.is_virtual]

    def io_tensors(self) -> list[TensorAttributes]:
        """Every tensor the caller must pass in the variant pack."""
        return [t for t in self.tensors if not t.is_virtual and not t.is_scalar]

    def topological_nodes(self) -> list[Node]:
        """Nodes in dependency order (insertion order among independent nodes).

        Raises:
            InvalidValueError: naming a node on a cycle.
        """
        produced = self.producers()
        done: set[int] = set()
        order: list[Node] = []
        # Iterative depth-first search: graphs from files may be long chains.
        for root in self.nodes:
            if id(root) in done:
                continue
            stack: list[tuple[Node, bool]] = [(root, False)]
            on_path: set[int] = set()
            while stack:
                node, expanded = stack.pop()
                if expanded:
                    on_path.discard(id(node))
                    if id(node) not in done:
                        done.add(id(node))
                        order.append(node)
                    continue
                if id(node) in done:
                    continue
                if id(node) in on_path:
                    raise NodeError(node, "inputs", "the graph has a cycle through this node")
                on_path.add(id(node))
                stack.append((node, True))
                for t in reversed([t for t in node.inputs.values() if t is not None]):
                    parent = produced.get(id(t))
                    if parent is not None and id(parent) not in done:
                        if id(parent) in on_path:
                            raise NodeError(
                                parent, "inputs", "the graph has a cycle through this node"
                            )
                        stack.append((parent, False))
        return order

    def core_node(self) -> Node:
        """The node that names the graph in override files (RFC 0013 section 6.5 priority)."""
        if not self.nodes:
            raise InvalidValueError(f"graph {self.name!r} has no nodes")
        best = self.nodes[0]
        for node in self.topological_nodes():
            if spec_for(node.kind).priority > spec_for(best.kind).priority:
                best = node
        return best

    # ---- validation ---------------------------------------------------------------------
    def validate(self) -> None:
        """Check every node, tensor and the structure; fill in inferred dims and data types.

        Raises:
            InvalidValueError: naming the node and field (or tensor) that is wrong (the first
                of :meth:`problems`).
        """
        found = self.problems()
        if found:
            raise found[0]

    def problems(self) -> list[InvalidValueError]:
        """Every problem :meth:`validate` would find, in the order it checks; [] when valid.

        A structural problem (a duplicate uid, two writers of a tensor, a cycle) is reported
        alone, since the other checks need a sound structure. Otherwise every node, tensor and
        connection is checked, except what depends on a node that failed: the nodes that read
        its outputs, and those outputs (their dims were never inferred), whose problems would
        only repeat it. When nothing is found the graph is validated, as after :meth:`validate`.
        """
        self._validated = False
        if not self.nodes:
            return [InvalidValueError(f"graph {self.name!r} has no nodes; add an operation first")]
        try:
            self._check_uids()
            self._check_single_producer()
            order = self.topological_nodes()
        except InvalidValueError as exc:
            return [exc]
        found: list[InvalidValueError] = []
        try:  # the names and types may have been assigned since the graph was made
            for what, value in [("graph", self.name)] + [("node", n.name) for n in self.nodes]:
                if not isinstance(value, str):
                    raise InvalidValueError(f"{what} name must be a string, got {value!r}")
            for field_name in ("io_data_type", "compute_data_type", "intermediate_data_type"):
                check_data_type(getattr(self, field_name), f"graph {self.name!r}: {field_name}")
            for node in self.nodes:
                check_data_type(node.compute_data_type, f"node {node.name!r}: compute_data_type")
        except InvalidValueError as exc:
            return [exc]
        if self.compute_data_type is not None and self.compute_data_type not in _COMPUTE_TYPES:
            found.append(
                InvalidValueError(
                    f"graph {self.name!r}: compute_data_type "
                    f"{self.compute_data_type.json_name} is not a type to compute in; use "
                    f"one of {_COMPUTE_NAMES} (float for float, half and bfloat16 data)"
                )
            )
        for node in self.nodes:
            for name, value in node.params.items():
                if isinstance(value, float) and math.isnan(value):
                    # no operation takes a NaN parameter, as no scalar is NaN (refused here, as
                    # a NaN scalar is): its outputs were NaN, which the reference check matched
                    # and passed (new-user audit, session 56)
                    found.append(NodeError(node, name, "is NaN; give it a number"))
            if node.compute_data_type is not None and node.compute_data_type not in _COMPUTE_TYPES:
                found.append(
                    NodeError(
                        node,
                        "compute_data_type",
                        f"{node.compute_data_type.json_name} is not a type to compute in; use "
                        f"one of {_COMPUTE_NAMES}",
                    )
                )

        def attempt(check: Callable[[], None]) -> bool:
            try:
                check()
            except InvalidValueError as exc:
                found.append(exc)
                return False
            return True

        failed: set[int] = set()  # id() of nodes that failed or read a failed node's output
        tainted: set[int] = set()  # id() of the tensors those nodes write
        for node in order:
            upstream_failed = any(t is not None and id(t) in tainted for t in node.inputs.values())
            if upstream_failed or not attempt(partial(self.check_node, node)):
                failed.add(id(node))
                tainted.update(id(t) for t in node.outputs.values() if t is not None)
        for t in self.tensors:
            attempt(partial(self._fill_data_type, t))
        for t in self.tensors:
            if id(t) not in tainted:
                attempt(partial(self._check_tensor, t))
        for node in order:
            if id(node) not in failed:
                attempt(partial(self._check_node_types, node))
        produced = self.producers()
        consumed = {id(t) for n in self.nodes for t in n.inputs.values() if t is not None}
        for t in self.tensors:
            attempt(partial(self._check_use, t, produced, consumed))
        if len(self.nodes) > 1:
            attempt(self._check_connected)
        self._validated = not found
        return found

    @property
    def is_validated(self) -> bool:
        return self._validated

    def check_node(self, node: Node) -> None:
        """Check one node's fields and shapes, inferring its output dims."""
        spec = spec_for(node.kind)
        for f in spec.inputs:
            if node.inputs.get(f) is None:
                raise NodeError(node, f, "required input missing")
        for f in spec.outputs:
            if node.outputs.get(f) is None:
                raise NodeError(node, f, "required output missing")
        for f in node.inputs:
            if f not in spec.all_inputs:
                raise NodeError(node, f, f"unknown input field; expected {spec.all_inputs}")
        for f in node.outputs:
            if f not in spec.all_outputs:
                raise NodeError(node, f, f"unknown output field; expected {spec.all_outputs}")
        for f, t in node.inputs.items():
            if t is not None and not t.dims:
                raise NodeError(node, f, f"tensor {t.name!r} has no dims (set them first)")
            if t is not None and any(d < 1 for d in t.dims):
                raise NodeError(node, f, f"tensor {t.name!r} has dims {t.dims}; each must be >= 1")
            if t is not None and f.startswith("epsilon") and t.is_scalar:
                eps = finite_float(t.value)  # None for a huge integer too (OverflowError)
                if eps is None or eps < 0:
                    raise NodeError(
                        node,
                        f,
                        f"epsilon {short_repr(t.value)} must be a finite number >= 0 (e.g. 1e-5)",
                    )
        for p in spec.params:
            if node.params.get(p.name) is None:
                if p.required:
                    raise NodeError(node, p.name, "required parameter missing")
                if p.default is not None:
                    node.infer(p.name, p.default)
        spec.check(node)

    def _check_uids(self) -> None:
        seen: dict[int, TensorAttributes] = {}
        for t in self.tensors:
            if t.uid is None:
                continue
            if t.uid in seen:
                raise TensorError(
                    t, f"duplicate uid {t.uid}, also used by {seen[t.uid].name!r}", "uid"
                )
            seen[t.uid] = t
        self.assign_uids()

    def _check_single_producer(self) -> None:
        writers: dict[int, Node] = {}
        for node in self.nodes:
            for field_name, t in node.outputs.items():
                if t is None:
                    continue
                if id(t) in writers:
                    raise NodeError(
                        node,
                        field_name,
                        f"tensor {t.name!r} (uid {t.uid}) is already written by node "
                        f"{writers[id(t)].name!r}",
                    )
                if t.is_scalar:
                    raise NodeError(node, field_name, "a pass-by-value scalar cannot be an output")
                writers[id(t)] = node

    def default_data_type(self, t: TensorAttributes) -> DataType | None:
        """The type ``t`` gets from the graph's types when none is set: the intermediate type
        for a virtual tensor, the io type for a buffer, float for a scalar."""
        if t.is_scalar:
            return DataType.FLOAT
        if t.is_virtual:
            return self.intermediate_data_type or self.compute_data_type or self.io_data_type
        return self.io_data_type

    def _fill_data_type(self, t: TensorAttributes) -> None:
        if t.data_type is not None and not t._auto_data_type:
            return
        data_type = self.default_data_type(t)
        if data_type is None:
            raise TensorError(
                t,
                "has no data type and the graph sets no io_data_type/intermediate_data_type; "
                "set one of them",
                "data_type",
            )
        t._infer_data_type(data_type)

    def _check_tensor(self, t: TensorAttributes) -> None:
        if not t.dims:
            raise TensorError(t, "has no dims", "dims")
        if any(d < 1 or d > INT64_RANGE[1] for d in t.dims):
            raise TensorError(t, f"dims {t.dims}: each must be >= 1", "dims")
        if len(t.strides) != len(t.dims):
            raise TensorError(
                t, f"strides {t.strides} must have one entry per dim {t.dims}", "strides"
            )
        if any(s < 0 or s > INT64_RANGE[1] for s in t.strides):
            raise TensorError(t, f"strides {t.strides} must be >= 0", "strides")
        too_large = byte_size_problem(t)
        if too_large is not None:
            raise TensorError(t, too_large[1], too_large[0])
        if t.is_scalar:
            problem = scalar_value_problem(t)
            if problem is not None:
                raise TensorError(t, problem, "value")
            if t.numel != 1:
                raise TensorError(
                    t, f"a pass-by-value scalar must hold one value, got {t.dims}", "dims"
                )
            if t.is_virtual:
                raise TensorError(t, "a pass-by-value scalar cannot be virtual", "virtual")
            if t.data_type not in SCALAR_TYPES:
                names = ", ".join(sorted(d.json_name for d in SCALAR_TYPES))
                dtype = t.data_type.json_name if t.data_type else "unset"
                raise TensorError(
                    t, f"a pass-by-value scalar must be one of {names}, got {dtype}", "data_type"
                )
        elif not t.is_virtual and self._is_written(t):
            shared = overlap(t.dims, t.strides)
            if shared is not None:
                raise TensorError(
                    t,
                    f"strides {t.strides} {shared[0]}make elements of dims {t.dims} overlap"
                    f"{shared[1]}; an output buffer needs distinct addresses",
                    "strides",
                )

    def _is_written(self, t: TensorAttributes) -> bool:
        return any(o is t for n in self.nodes for o in n.outputs.values())

    def _check_node_types(self, node: Node) -> None:
        spec = spec_for(node.kind)
        for f in spec.float_fields:
            t = node.inputs.get(f) or node.outputs.get(f)
            if t is not None and t.data_type is not None and not t.data_type.is_floating:
                raise NodeError(
                    node,
                    f,
                    f"tensor {t.name!r} must be floating point, got {t.data_type.json_name}",
                )
        spec.check_types(node)

    @staticmethod
    def _check_use(t: TensorAttributes, produced: Container[int], consumed: Container[int]) -> None:
        """A tensor is read or written by some node; a virtual one is both written and read."""
        if id(t) not in produced and id(t) not in consumed:
            raise TensorError(t, "is not used by any node; remove it")
        if t.is_virtual and id(t) not in produced:
            raise TensorError(
                t,
                "is virtual but no node writes it; a graph input needs a buffer (virtual false)",
                "virtual",
            )
        if t.is_virtual and id(t) not in consumed:
            raise TensorError(
                t,
                "is virtual and never read: call set_output(True) on it to make it a graph output",
                "virtual",
            )

    def _check_connected(self) -> None:
        parent = list(range(len(self.nodes)))

        def find(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        owner: dict[int, int] = {}
        for i, node in enumerate(self.nodes):
            for t in node.tensors():
                if t.is_scalar:
                    continue
                if id(t) in owner:
                    parent[find(i)] = find(owner[id(t)])
                else:
                    owner[id(t)] = i
        roots = {find(i) for i in range(len(self.nodes))}
        if len(roots) > 1:
            groups = [[n.name for i, n in enumerate(self.nodes) if find(i) == r] for r in roots]
            raise InvalidValueError(
                f"graph {self.name!r} has {len(roots)} unconnected parts {groups}; split it into "
                "one graph per part"
            )

    def iter_scalars(self) -> Iterable[TensorAttributes]:
        return (t for t in self.tensors if t.is_scalar)
