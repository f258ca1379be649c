package fleet

// Halt stops the report loop without leaving the fleet, as a member that
// crashed or lost its network would: the others age it out after ttl.
func (c *Controller) Halt() {
	c.closeOnce.Do(func() {
		close(c.stop)
		<-c.done
		c.getClient().Close()
	})
}

var ParseStore = func(raw string) (kind string, tls bool, user string, addrs []string, master string, db int, err error) {
	s, err := parseStore(raw)
	return s.kind, s.tls, s.username, s.addrs, s.master, s.db, err
}
