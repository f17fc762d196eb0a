"""`BuiltByCall`: batchrl's Keras layers and models that hold layers are built by their first
call, without Keras' symbolic trace of it."""


class BuiltByCall:
    """A mixin, before the Keras base (`class MLP(BuiltByCall, keras.layers.Layer)`), for a
    layer or model whose own variables, if any, are made in its constructor, the others
    belonging to the layers it holds: its `build` does nothing, so each of those layers is
    built by the first call, from the shapes it receives there.

    Without a `build` of its own, a Keras 3 layer is built by first running its `call` on
    symbolic inputs in a scratch graph (`Layer._maybe_build`, `backend.compute_output_spec`),
    where each layer it holds also computes its initial weights as graph ops, and then the
    call runs for real. The networks of `pendulum` (PPO's policy and value) took 0.31-0.38 s
    to build so and 0.065-0.070 s with this mixin. The weights are the same: Keras'
    initializers draw stateless random numbers from the seed each took when constructed.
    The first call must run where variables can be made: eagerly, as the network
    constructors call each network once on a zero input, or in a `tf.function`'s first trace.
    """

    def build(self, input_shape=None):
        """Nothing to build before the first call (Keras calls it with the first input's
        shape and marks the layer built)."""
        del input_shape
