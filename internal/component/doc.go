// Package component is the lifecycle every long-running piece of kelp
// shares, and the Group that runs pieces in order.
//
// A piece (the datastore, the apiserver, containerd's supervisor, a
// controller) is a Component: its constructor returns once it has
// launched; Ready is closed once it serves; a later failure arrives on Err;
// Stop is idempotent and bounded by a deadline. Go turns a blocking
// function into one. A Group starts pieces one after the other, waiting for
// each to be ready while it watches every piece already started, so a
// failure anywhere ends start-up at once with that piece's error; it then
// fans in their failures and stops them in reverse.
//
// Adding a piece to the server or a node is one line:
//
//	if err := g.Start(mything.Start(cfg)); err != nil {
//		return err
//	}
package component
