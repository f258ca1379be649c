package sandbox

import (
	"bufio"
	"net"
	"strings"
	"time"
)

// RedisUp reports whether the Redis or Valkey server on c answers PING
// within a second (RESP: "+PONG"), and, with noauth, also when it refuses
// it for want of a password ("-NOAUTH": it is up, the caller has no
// password to give). It closes c.
func RedisUp(c net.Conn, noauth bool) bool {
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && (strings.HasPrefix(line, "+PONG") || noauth && strings.HasPrefix(line, "-NOAUTH"))
}
