package fleet

// Halt stops the report loop without leaving the fleet, as a member that
// crashed or lost its network would: the others age it out after ttl.
func (c *Controller) Halt() {
	c.closeOnce.Do(func() {
		close(c.stop)
		<-c.done
		c.abandon()
		c.st.close()
	})
}
