package sim

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/alicebob/miniredis/v2"
	mserver "github.com/alicebob/miniredis/v2/server"
	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/internal/luamodel"
)

// directEval runs commands straight into an embedded miniredis's dispatcher, on the calling
// goroutine: the same command handlers and Lua engine as over a connection, without the
// three goroutine hand-offs per call of a piped connection (which dominate wall time when
// two simulations share two cores). Arguments are formatted as go-redis formats them.
type directEval struct {
	m    *miniredis.Miniredis
	out  bytes.Buffer
	peer *mserver.Peer
	args []string
}

func newDirectEval(m *miniredis.Miniredis) (*directEval, error) {
	// Dial starts the server without a listener; the connection itself is not used.
	c, err := m.Dial()
	if err != nil {
		return nil, fmt.Errorf("sim: miniredis: %w", err)
	}
	_ = c.Close()
	d := &directEval{m: m}
	d.peer = mserver.NewPeer(bufio.NewWriter(&d.out))
	return d, nil
}

// do runs one command and returns its parsed reply.
func (d *directEval) do(args []string) (any, error) {
	d.out.Reset()
	d.m.Server().Dispatch(d.peer, args)
	d.peer.Flush()
	r := bufio.NewReader(bytes.NewReader(d.out.Bytes()))
	return readRESP(r)
}

func (d *directEval) eval(s *redis.Script, keys []string, args ...any) (any, error) {
	d.args = append(d.args[:0], "EVALSHA", s.Hash(), strconv.Itoa(len(keys)))
	d.args = append(d.args, keys...)
	for _, a := range args {
		d.args = append(d.args, formatArg(a))
	}
	v, err := d.do(d.args)
	if err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
		src, ok := luamodel.Source(s)
		if !ok {
			return nil, fmt.Errorf("sim: no source for script %s", s.Hash())
		}
		if _, err = d.do([]string{"SCRIPT", "LOAD", src}); err != nil {
			return nil, err
		}
		v, err = d.do(d.args)
	}
	return v, err
}

// formatArg formats an argument as go-redis's appendArg does.
func formatArg(a any) string {
	switch v := a.(type) {
	case string:
		return v
	case int:
		return strconv.Itoa(v)
	case uint64:
		return strconv.FormatUint(v, 10)
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	default:
		return fmt.Sprint(v)
	}
}

// readRESP parses one RESP2 reply: arrays as []any, integers as int64, bulk and simple
// strings as string, a null as nil, an error reply as error.
func readRESP(r *bufio.Reader) (any, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, fmt.Errorf("sim: short reply: %w", err)
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return nil, errors.New("sim: empty reply")
	}
	body := line[1:]
	switch line[0] {
	case '+':
		return body, nil
	case '-':
		return nil, errors.New(body)
	case ':':
		return strconv.ParseInt(body, 10, 64)
	case '$':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return nil, err
		}
		b := make([]byte, n+2)
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, err
		}
		return string(b[:n]), nil
	case '*':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return nil, err
		}
		out := make([]any, n)
		for i := range out {
			if out[i], err = readRESP(r); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("sim: unknown reply %q", line)
}
