"""The model contract the service enforces: which model a request may name, how many tensors it may carry, and
each input's name, datatype and shape, the batch size and the requested outputs, checked against the signature.

Pure and transport-free. The codecs ask it through `codec.RequestContract` between reading a request's heads and
decoding its tensor data, so a request that cannot run is refused before its data is touched; the service asks
it again of every request it runs (`check_request`), whichever codec decoded it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from skiff_runtime.codec import RequestLimits
from skiff_runtime.errors import InvalidInput, ModelNotFound, reach_version_hint, shown
from skiff_runtime.tensors import (
    Array,
    Datatype,
    InferRequest,
    ModelSignature,
    TensorForm,
    TensorHead,
    TensorSpec,
    datatype_of,
    element_count,
)

# Inputs and outputs past the signature's count that are still decoded, so that a request naming one tensor
# twice or one the model lacks gets that error rather than a bare count.
SPARE_TENSORS = 4
# The most elements of a BYTES input whose non-batch dimensions are variable.
MAX_VARIABLE_BYTES_ELEMENTS = 1 << 20


def check_model(name: str, version: str, served_name: str, served_version: str) -> None:
    """NOT_FOUND unless (name, version) is the served model; an empty version means the served one."""
    if name != served_name:
        raise ModelNotFound(f"unknown model {shown(name)}; this server serves {served_name!r}")
    if version and version != served_version:
        raise ModelNotFound(
            f"model {shown(name)} has no version {shown(version)}; it serves version {served_version!r}; "
            + reach_version_hint(name, version)
        )


def _max_bytes_elements(spec: TensorSpec, max_batch_size: int) -> int:
    dims = [max_batch_size if d == -1 and i == 0 else d for i, d in enumerate(spec.shape)]
    return element_count(dims) if all(d >= 0 for d in dims) else MAX_VARIABLE_BYTES_ELEMENTS


def request_limits(signature: ModelSignature, max_batch_size: int) -> RequestLimits:
    """The wire caps for requests to a model with this signature (a few spare tensors, see SPARE_TENSORS)."""
    return RequestLimits(
        max_inputs=len(signature.inputs) + SPARE_TENSORS,
        max_outputs=len(signature.outputs) + SPARE_TENSORS,
        hint=f"the model takes {len(signature.inputs)} input(s) and has {len(signature.outputs)} output(s)",
        max_bytes_elements={
            s.name: _max_bytes_elements(s, max_batch_size) for s in signature.inputs if s.datatype is Datatype.BYTES
        },
    )


def check_heads(
    heads: Sequence[TensorHead],
    requested_outputs: Sequence[str],
    signature: ModelSignature,
    max_batch_size: int,
) -> None:
    """Every input the model takes, each with its datatype and a shape that fits its spec, one batch size within
    1..max_batch_size, and only outputs the model has; InvalidInput names the tensor and the mismatch."""
    specs = {spec.name: spec for spec in signature.inputs}
    unknown = [name for name, _, _ in heads if name not in specs]
    if unknown:
        raise InvalidInput(f"unknown input {shown(unknown[0])}; the model expects {list(specs)}")
    missing = [name for name in specs if name not in {h[0] for h in heads}]
    if missing:
        raise InvalidInput(f"missing input(s) {missing}; the model expects {list(specs)}")
    batch_sizes: dict[str, int] = {}
    for name, datatype, shape in heads:
        form = _form(specs[name], datatype, shape)
        for axis, (want, got) in enumerate(zip(form.shape, shape, strict=True)):
            if want != -1 and want != got:
                raise InvalidInput(
                    f"input {name!r}: dimension {axis} must be {want} (shape {list(form.shape)}), "
                    f"got {got} (shape {list(shape)})"
                )
        if form.batch_axis:
            batch_sizes[name] = shape[0]
    if batch_sizes:
        sizes = set(batch_sizes.values())
        if len(sizes) > 1:
            raise InvalidInput(f"inputs disagree on the batch dimension: {batch_sizes}")
        batch = sizes.pop()
        if batch < 1 or batch > max_batch_size:
            raise InvalidInput(f"batch size {batch} is outside 1..{max_batch_size} (the server's max batch size)")
    for name in requested_outputs:
        if signature.output(name) is None:
            raise InvalidInput(
                f"unknown requested output {shown(name)}; the model has {[s.name for s in signature.outputs]}"
            )


def _form(spec: TensorSpec, datatype: Datatype, shape: Sequence[int]) -> TensorForm:
    """The form of `spec` a head's datatype and rank pick; InvalidInput naming every accepted form otherwise."""
    forms = spec.forms
    typed = [f for f in forms if f.datatype is datatype]
    accepted = " or ".join(f.describe() for f in forms)
    if not typed:
        expected = spec.datatype.value if len(forms) == 1 else accepted
        raise InvalidInput(f"input {spec.name!r}: expected datatype {expected}, got {datatype.value}")
    ranked = [f for f in typed if len(f.shape) == len(shape)]
    if not ranked:
        want = typed[0] if len(typed) == 1 else None
        expected = f"rank {len(want.shape)} (shape {list(want.shape)})" if want else f"one of {accepted}"
        raise InvalidInput(f"input {spec.name!r}: expected {expected}, got rank {len(shape)} (shape {list(shape)})")
    return ranked[0]


def request_rows(signature: ModelSignature, inputs: Mapping[str, Array]) -> int:
    """The rows a validated request counts against the max batch size: its inputs' batch axis (an OCR request's
    images), or 1 when every input came in a form without one (one UINT8 H x W x C image)."""
    specs = {spec.name: spec for spec in signature.inputs}
    for name, array in inputs.items():
        spec = specs.get(name)
        if spec is not None and _form(spec, datatype_of(array), array.shape).batch_axis:
            return int(array.shape[0])
    return 1


@dataclass(frozen=True)
class ModelContract:
    """A loaded model's signature and the server's max batch size: the `codec.RequestContract` the codecs check
    requests against, built once per model."""

    signature: ModelSignature
    max_batch_size: int
    limits: RequestLimits = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "limits", request_limits(self.signature, self.max_batch_size))

    def check_heads(self, inputs: Sequence[TensorHead], requested_outputs: Sequence[str]) -> None:
        check_heads(inputs, requested_outputs, self.signature, self.max_batch_size)

    def check_request(self, request: InferRequest) -> None:
        """A decoded request, checked as its heads are: the service runs no request that fails this."""
        heads = [TensorHead(t.name, t.datatype, t.shape) for t in request.inputs]
        check_heads(heads, request.requested_outputs, self.signature, self.max_batch_size)
