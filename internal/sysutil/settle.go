package sysutil

import (
	"sync"
	"time"
)

// Events merges the updates of netlink subscriptions (links, addresses,
// routes) into ticks, for a follower that rereads the state on a change
// and needs no update's content. It ends when any subscription ends.
type Events struct {
	tick chan struct{}
	end  chan struct{}
	once sync.Once
}

// NewEvents returns Events that no subscription follows yet.
func NewEvents() *Events {
	return &Events{tick: make(chan struct{}, 1), end: make(chan struct{})}
}

// Follow ticks e on each update of in until done is closed; when in
// closes (its subscription ended), e ends.
func Follow[T any](e *Events, done <-chan struct{}, in <-chan T) {
	go func() {
		for {
			select {
			case <-done:
				return
			case _, ok := <-in:
				if !ok {
					e.once.Do(func() { close(e.end) })
					return
				}
				select {
				case e.tick <- struct{}{}:
				default:
				}
			}
		}
	}()
}

// Settle calls f once for each burst of ticks, quiet after the burst's
// first (events in a burst, such as an interface going down with all its
// addresses, are read as one), until done is closed or e ends.
func (e *Events) Settle(done <-chan struct{}, quiet time.Duration, f func()) {
	for {
		select {
		case <-done:
			return
		case <-e.end:
			return
		case <-e.tick:
		}
		t := time.NewTimer(quiet)
	burst:
		for {
			select {
			case <-done:
				t.Stop()
				return
			case <-e.tick:
			case <-t.C:
				break burst
			}
		}
		f()
	}
}
