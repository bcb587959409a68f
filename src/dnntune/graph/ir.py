"""OpGraph: the intermediate representation (tensors + nodes), its validation and ordering.

OpGraph knows nothing of engines. The user-facing :class:`dnntune.Graph` builds on it.
"""

from __future__ import annotations

from collections.abc import Iterable

from dnntune.errors import InvalidValueError
from dnntune.graph.node import Node
from dnntune.graph.ops import spec_for
from dnntune.graph.tensor import TensorAttributes
from dnntune.graph.types import DataType

__all__ = ["OpGraph"]


class OpGraph:
    """Tensors and nodes of one operation graph, with graph-level data types."""

    def __init__(
        self,
        name: str = "",
        io_data_type: DataType | None = None,
        compute_data_type: DataType | None = None,
        intermediate_data_type: DataType | None = None,
    ) -> None:
        self.name = name
        self.io_data_type = io_data_type
        self.compute_data_type = compute_data_type
        self.intermediate_data_type = intermediate_data_type
        self.tensors: list[TensorAttributes] = []
        self.nodes: list[Node] = []
        self._validated = False

    # ---- construction -------------------------------------------------------------------
    def add_tensor(self, tensor: TensorAttributes) -> TensorAttributes:
        """Register a tensor (idempotent for the same object)."""
        if all(tensor is not t for t in self.tensors):
            self.tensors.append(tensor)
        self._validated = False
        return tensor

    def add_node(self, node: Node) -> Node:
        """Append a node and register every tensor it touches."""
        for t in node.tensors():
            self.add_tensor(t)
        self.nodes.append(node)
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
        """Nodes in dependency order (insertion order among independent nodes)."""
        produced = self.producers()
        done: set[int] = set()
        visiting: set[int] = set()
        order: list[Node] = []

        def visit(node: Node) -> None:
            if id(node) in done:
                return
            if id(node) in visiting:
                raise InvalidValueError(f"graph {self.name!r} contains a cycle at node {node.name!r}")
            visiting.add(id(node))
            for t in node.inputs.values():
                if t is not None and id(t) in produced:
                    visit(produced[id(t)])
            visiting.discard(id(node))
            done.add(id(node))
            order.append(node)

        for node in self.nodes:
            visit(node)
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
            InvalidValueError: naming the node and field (or tensor) that is wrong.
        """
        if not self.nodes:
            raise InvalidValueError(f"graph {self.name!r} has no nodes; add an operation first")
        self._check_uids()
        self._check_single_producer()
        for node in self.topological_nodes():
            self._check_node_tensors(node)
            spec_for(node.kind).check(node)
        self._fill_data_types()
        for t in self.tensors:
            self._check_tensor(t)
        self._check_connectivity()
        self._validated = True

    @property
    def is_validated(self) -> bool:
        return self._validated

    def _check_uids(self) -> None:
        seen: dict[int, TensorAttributes] = {}
        for t in self.tensors:
            if t.uid is None:
                continue
            if t.uid in seen:
                raise InvalidValueError(
                    f"duplicate tensor uid {t.uid}: {seen[t.uid].name!r} and {t.name!r}"
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
                    raise InvalidValueError(
                        f"node {node.name!r}: {field_name}: tensor {t.name!r} (uid {t.uid}) is "
                        f"already written by node {writers[id(t)].name!r}"
                    )
                if t.is_scalar:
                    raise InvalidValueError(
                        f"node {node.name!r}: {field_name}: a pass-by-value scalar cannot be an output"
                    )
                writers[id(t)] = node

    def _check_node_tensors(self, node: Node) -> None:
        spec = spec_for(node.kind)
        for f in spec.inputs:
            if node.inputs.get(f) is None:
                raise InvalidValueError(f"node {node.name!r} ({node.kind.value}): {f}: required input missing")
        for f in spec.outputs:
            if node.outputs.get(f) is None:
                raise InvalidValueError(f"node {node.name!r} ({node.kind.value}): {f}: required output missing")
        for f in node.inputs:
            if f not in spec.all_inputs:
                raise InvalidValueError(f"node {node.name!r}: unknown input field {f!r}")
        for f in node.outputs:
            if f not in spec.all_outputs:
                raise InvalidValueError(f"node {node.name!r}: unknown output field {f!r}")
        for f, t in node.inputs.items():
            if t is not None and not t.dims:
                raise InvalidValueError(
                    f"node {node.name!r}: {f}: tensor {t.name!r} has no dims (set them first)"
                )

    def _fill_data_types(self) -> None:
        for t in self.tensors:
            if t.data_type is not None and not t._auto_data_type:
                continue
            if t.is_scalar:
                t.data_type = DataType.FLOAT
            elif t.is_virtual:
                t.data_type = self.intermediate_data_type or self.compute_data_type or self.io_data_type
            else:
                t.data_type = self.io_data_type
            if t.data_type is None:
                raise InvalidValueError(
                    f"tensor {t.name!r} (uid {t.uid}) has no data type and the graph sets no "
                    "io_data_type/intermediate_data_type; set one of them"
                )
            t._auto_data_type = True

    def _check_tensor(self, t: TensorAttributes) -> None:
        where = f"tensor {t.name!r} (uid {t.uid})"
        if any(d < 0 for d in t.dims):
            raise InvalidValueError(f"{where}: dims {t.dims} must be >= 0")
        if len(t.strides) != len(t.dims):
            raise InvalidValueError(f"{where}: strides {t.strides} must have one entry per dim {t.dims}")
        if any(s < 0 for s in t.strides):
            raise InvalidValueError(f"{where}: strides {t.strides} must be >= 0")
        if t.is_scalar and t.numel != 1:
            raise InvalidValueError(f"{where}: a pass-by-value scalar must have dims [1], got {t.dims}")

    def _check_connectivity(self) -> None:
        produced = self.producers()
        consumed = {id(t) for n in self.nodes for t in n.inputs.values() if t is not None}
        for t in self.tensors:
            if t.is_virtual and id(t) not in produced:
                raise InvalidValueError(
                    f"tensor {t.name!r} (uid {t.uid}) is virtual but no node writes it"
                )
            if t.is_virtual and id(t) not in consumed:
                raise InvalidValueError(
                    f"tensor {t.name!r} (uid {t.uid}) is virtual and never read: call "
                    "set_output(True) on it to make it a graph output"
                )
        if len(self.nodes) > 1:
            self._check_connected()

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
        if len({find(i) for i in range(len(self.nodes))}) > 1:
            raise InvalidValueError(
                f"graph {self.name!r} has more than one connected component; please split the graph"
            )

    def iter_scalars(self) -> Iterable[TensorAttributes]:
        return (t for t in self.tensors if t.is_scalar)
