package prometheus

// Series returns the number of label sets held.
func (c *Collector) Series() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	n := 0
	for _, d := range c.datasets {
		d.mu.RLock()
		n += d.live
		d.mu.RUnlock()
	}
	return n
}
