package testbed

// ownCleanups are cleanups a test runs itself rather than at its end, to
// see what they do or leave: the fake TBs of this package's tests keep
// theirs here.
type ownCleanups []func()

// add registers f.
func (c *ownCleanups) add(f func()) { *c = append(*c, f) }

// run runs them last registered first, as testing does, and forgets them.
func (c *ownCleanups) run() {
	for i := len(*c) - 1; i >= 0; i-- {
		(*c)[i]()
	}
	*c = nil
}
