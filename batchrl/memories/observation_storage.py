"""How the memories keep observations: the elements of a flattened nested observation that
are always integers in [0, 255] (the pixels of a `Dict` observation's images, binary frames,
one-hot and binary elements) as uint8, a quarter of the bytes of float32, the others as
they are.

A `Box` observation of images is uint8 in the batch already and is stored as it is; this is
for the flat float32 vectors of nested observations (`batchrl.spaces.nested`), where an image
entry would otherwise take 4 bytes a pixel in the episode memory and the replay memory.
"""

import numpy as np
import tensorflow as tf

from batchrl.spaces import nested

BYTES_SUFFIX = "_bytes"


class ObservationStorage:
    """Splits flat observations into a float32 field and a uint8 field of the byte-valued
    elements, and joins them again, inside the graph.

    A field `name` of a memory becomes `name` (float32 `[..., n - k]`, the other elements in
    their order; left out when k = n) and `name_bytes` (uint8 `[..., k]`) for the k byte
    elements; `decode` gives back the float32 `[..., n]` observation exactly. Without byte
    elements (or for an observation that is not a float32 vector) the field is kept as one,
    in its dtype.

    Args:
      shape: tuple, the shape of one observation.
      dtype: `tf.DType` of the observations.
      byte_elements: None, or bool array of `shape`: the elements whose values are integers
        in [0, 255] whenever they are stored (not normalized).

    Raises:
      ValueError: `byte_elements` does not have the shape `shape`.
    """

    def __init__(self, shape, dtype, byte_elements=None):
        self._shape = tuple(int(size) for size in shape)
        self._dtype = tf.as_dtype(dtype)
        self._byte_index = self._float_index = self._order = None
        if byte_elements is None:
            return
        byte_elements = np.asarray(byte_elements, bool)
        if byte_elements.shape != self._shape:
            raise ValueError(f"ObservationStorage: byte_elements of shape "
                             f"{byte_elements.shape}, expected {self._shape}")
        if self._dtype != tf.float32 or len(self._shape) != 1 or not byte_elements.any():
            return
        self._byte_index = np.flatnonzero(byte_elements)
        self._float_index = np.flatnonzero(~byte_elements)
        # Where each element lands in `concat([floats, bytes])`, in the observation's order.
        self._order = np.argsort(np.concatenate([self._float_index, self._byte_index]))

    @classmethod
    def for_space(cls, space, shape, dtype, normalized=None):
        """The storage of a batch env's observations (`shape`, `dtype`) of `space`: byte
        elements are those of a `FlatObservationSpace`'s `byte_valued` that are not in the
        bool array `normalized` (the elements a normalizer changes before they are stored;
        None: none are)."""
        if not isinstance(space, nested.FlatObservationSpace):
            return cls(shape, dtype)
        byte_elements = space.byte_valued
        if normalized is not None:
            byte_elements = byte_elements & ~np.asarray(normalized, bool)
        return cls(shape, dtype, byte_elements)

    @property
    def shape(self):
        """tuple of ints, the shape of one observation."""
        return self._shape

    @property
    def dtype(self):
        """`tf.DType` of the observations."""
        return self._dtype

    @property
    def split(self):
        """bool, whether byte elements are kept in a field of their own."""
        return self._byte_index is not None

    def specs(self, name):
        """dict of the fields that keep observations `name`: field name to `(shape, dtype)`
        of one observation."""
        if not self.split:
            return {name: (self._shape, self._dtype)}
        specs = {name + BYTES_SUFFIX: ((self._byte_index.size,), tf.uint8)}
        if self._float_index.size:  # A variable of no elements would take no writes.
            specs[name] = ((self._float_index.size,), tf.float32)
        return specs

    def encode(self, name, observ):
        """The fields (dict, as `specs`) that keep `observ` `[..., *shape]`."""
        observ = tf.cast(observ, self._dtype)
        if not self.split:
            return {name: observ}
        fields = {name + BYTES_SUFFIX: tf.cast(tf.gather(observ, self._byte_index, axis=-1),
                                               tf.uint8)}
        if self._float_index.size:
            fields[name] = tf.gather(observ, self._float_index, axis=-1)
        return fields

    def decode(self, name, fields):
        """The observations `[..., *shape]` (their dtype) kept in `fields[name]` and, if
        split, `fields[name + "_bytes"]`."""
        if not self.split:
            return fields[name]
        joined = tf.cast(fields[name + BYTES_SUFFIX], tf.float32)
        if self._float_index.size:
            joined = tf.concat([fields[name], joined], -1)
        return tf.gather(joined, self._order, axis=-1)
