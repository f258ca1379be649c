package agent

import (
	"sync"
	"time"
)

// subscriptionErrors is a netlink subscription's error callback that logs
// msg with the error, except once done is closed: the subscription's
// socket is closed then (after done, by the netlink package), and its
// failed receive is the end asked for, not an error. A refused start
// closes done before it exits, and says one line.
func (a *Agent) subscriptionErrors(done <-chan struct{}, msg string) func(error) {
	return func(err error) {
		select {
		case <-done:
			return
		default:
		}
		a.log.Warn(msg, "err", err)
	}
}

// events merges the updates of netlink subscriptions (links, addresses,
// routes) into ticks, for a follower that rereads the state on a change
// and needs no update's content. It ends when any subscription ends.
type events struct {
	tick chan struct{}
	end  chan struct{}
	once sync.Once
}

func newEvents() *events {
	return &events{tick: make(chan struct{}, 1), end: make(chan struct{})}
}

// follow ticks e on each update of in until done is closed; when in
// closes (its subscription ended), e ends.
func follow[T any](e *events, done <-chan struct{}, in <-chan T) {
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

// settle calls f once for each burst of ticks, quiet after the burst's
// first (events in a burst, such as an interface going down with all its
// addresses, are read as one), until done is closed or e ends.
func (e *events) settle(done <-chan struct{}, quiet time.Duration, f func()) {
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
