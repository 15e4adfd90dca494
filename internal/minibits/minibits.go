// Package minibits adds the BITFIELD and BITFIELD_RO commands to a miniredis, which
// has neither (v2.40.0). fleetlimit's windowed limits keep their counters in BITFIELD
// strings, and both the fresh-machine default (no Redis configured: an embedded
// miniredis) and the tests of those limits run on miniredis, so they need the command
// to behave as a real Redis's does: same replies, same errors, same bytes left in the
// string.
//
// The semantics are those of Redis 7 (bitops.c): GET, SET, INCRBY and OVERFLOW
// WRAP|SAT|FAIL subcommands; types i1..i64 and u1..u63; plain or '#'-prefixed offsets;
// big-endian bit order; the whole command parsed before anything is read or written;
// a missing key read as an empty string and left missing by a call of GETs only; the
// string grown with zero bytes to cover the highest bit any SET or INCRBY names, even
// when OVERFLOW FAIL then leaves every field unchanged.
//
// The commands read and write the value through miniredis's direct API, so unlike the
// built-in commands they are atomic only with respect to each other: every BITFIELD of
// one Miniredis runs under one mutex, so concurrent calls from many connections never
// lose an update, but a SET, APPEND or SETBIT of the same key from another connection
// may interleave with one. A key's TTL is kept. They use the connection's SELECTed
// database. Inside MULTI they run when queued, and EXEC answers their reply in its
// place: a custom command cannot read a key while EXEC holds miniredis's lock, so the
// call is atomic with the transaction's other commands only as far as no other
// connection writes its key meanwhile, and a DISCARDed transaction keeps its writes.
// From a Lua script they answer an error rather than run (a script holds that lock
// too).
package minibits

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/alicebob/miniredis/v2"
	"github.com/alicebob/miniredis/v2/server"
)

// Error replies, as Redis words them.
const (
	msgWrongType   = "WRONGTYPE Operation against a key holding the wrong kind of value"
	msgSyntax      = "ERR syntax error"
	msgBadType     = "ERR Invalid bitfield type. Use something like i16 u8. Note that u64 is not supported but i64 is."
	msgBadOffset   = "ERR bit offset is not an integer or out of range"
	msgBadValue    = "ERR value is not an integer or out of range"
	msgBadOverflow = "ERR Invalid OVERFLOW type specified"
	msgReadOnly    = "ERR BITFIELD_RO only supports the GET subcommand"
	msgInMulti     = "ERR %s inside MULTI is not supported by miniredis (minibits)"
	msgInScript    = "ERR %s from a Lua script is not supported by miniredis (minibits)"
)

// maxBulkLen is Redis's default proto-max-bulk-len (512 MB): a bit offset's byte must
// lie below it.
const maxBulkLen = 512 << 20

// Register adds BITFIELD and BITFIELD_RO to m's command table. m must be started (its
// Server is non-nil); Register fails when either command is registered already, for
// instance by an earlier Register on the same m. All calls of the two commands on m
// are serialized with a mutex of this Register call. m.Restart starts a new server
// with only miniredis's own commands: call Register again after it.
func Register(m *miniredis.Miniredis) error {
	srv := m.Server()
	if srv == nil {
		return errors.New("minibits: miniredis is not started")
	}
	b := &bitfield{m: m}
	if err := srv.Register("BITFIELD", func(c *server.Peer, cmd string, args []string) {
		b.serve(c, cmd, args, false)
	}); err != nil {
		return err
	}
	return srv.Register("BITFIELD_RO", func(c *server.Peer, cmd string, args []string) {
		b.serve(c, cmd, args, true)
	}, server.ReadOnlyOption())
}

// store is where a call reads and writes its key: a database of the Miniredis
// (*miniredis.RedisDB), or the Miniredis itself (its direct commands use the database
// chosen with its Select method).
type store interface {
	Get(k string) (string, error)
	Set(k, v string) error
	TTL(k string) time.Duration
	SetTTL(k string, ttl time.Duration)
}

// bitfield serves the commands of one Register call.
type bitfield struct {
	m  *miniredis.Miniredis
	mu sync.Mutex // held from the read of a key to its write
}

// overflow is an OVERFLOW behaviour.
type overflow uint8

const (
	wrap overflow = iota
	sat
	fail
)

// opKind is a subcommand that answers a value.
type opKind uint8

const (
	opGet opKind = iota
	opSet
	opIncrBy
)

// op is one parsed GET, SET or INCRBY.
type op struct {
	kind   opKind
	signed bool
	bits   uint   // 1..64 signed, 1..63 unsigned
	offset uint64 // in bits, from the most significant bit of byte 0
	value  int64  // SET's value or INCRBY's increment
	ow     overflow
}

// result is one entry of the reply: an integer, or nil for a SET or INCRBY that OVERFLOW
// FAIL refused.
type result struct {
	v   int64
	nil bool
}

// serve answers one BITFIELD (readOnly false) or BITFIELD_RO call; args start with
// the key.
func (b *bitfield) serve(c *server.Peer, cmd string, args []string, readOnly bool) {
	if len(args) < 1 {
		c.WriteError("ERR wrong number of arguments for '" + strings.ToLower(cmd) + "' command")
		return
	}
	db, nested, inTx, known := connState(c)
	if nested {
		c.WriteError(fmt.Sprintf(msgInScript, cmd))
		return
	}
	res, errMsg := b.call(db, known, args, readOnly)
	if inTx {
		if !queue(c, func(p *server.Peer) { p.Block(func(w *server.Writer) { reply(w, res, errMsg) }) }) {
			c.WriteError(fmt.Sprintf(msgInMulti, cmd))
			return
		}
		c.WriteInline("QUEUED")
		return
	}
	c.Block(func(w *server.Writer) { reply(w, res, errMsg) })
}

// call runs one call on database db (known false: the Miniredis's selected one); args
// start with the key. It returns the reply's values, or the error reply's message.
func (b *bitfield) call(db int, known bool, args []string, readOnly bool) ([]result, string) {
	key := args[0]
	ops, writes, top, errMsg := parse(args[1:])
	if errMsg != "" {
		return nil, errMsg
	}
	if readOnly && writes {
		return nil, msgReadOnly
	}
	var st store = b.m
	if known {
		st = b.m.DB(db)
	}
	return b.run(st, key, ops, writes, top)
}

// reply writes a call's reply to w: the values res, or the error errMsg.
func reply(w *server.Writer, res []result, errMsg string) {
	if errMsg != "" {
		w.WriteError(errMsg)
		return
	}
	w.WriteLen(len(res))
	for _, r := range res {
		if r.nil {
			w.WriteNull()
		} else {
			w.WriteRaw(":" + strconv.FormatInt(r.v, 10) + "\r\n")
		}
	}
}

// queue appends write to the transaction open on c (miniredis's connCtx.transaction, a
// []txCmd): EXEC calls it in its turn. It reports false when Ctx is not laid out as in
// miniredis v2.40.0.
func queue(c *server.Peer, write func(*server.Peer)) bool {
	v := reflect.ValueOf(c.Ctx)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return false
	}
	tx := v.Elem().FieldByName("transaction")
	if tx.Kind() != reflect.Slice || tx.Type().Elem().Kind() != reflect.Func || tx.Type().Elem().NumIn() != 2 ||
		tx.Type().Elem().In(0) != reflect.TypeFor[*server.Peer]() || tx.Type().Elem().NumOut() != 0 {
		return false
	}
	tx = reflect.NewAt(tx.Type(), unsafe.Pointer(tx.UnsafeAddr())).Elem() // an unexported field
	cb := reflect.MakeFunc(tx.Type().Elem(), func(in []reflect.Value) []reflect.Value {
		write(in[0].Interface().(*server.Peer))
		return nil
	})
	tx.Set(reflect.Append(tx, cb))
	return true
}

// run executes ops on key under b's mutex. writes says whether any op is a SET or
// INCRBY, top is the highest bit they write.
func (b *bitfield) run(st store, key string, ops []op, writes bool, top uint64) ([]result, string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	v, err := st.Get(key)
	switch {
	case errors.Is(err, miniredis.ErrKeyNotFound):
		v = ""
	case errors.Is(err, miniredis.ErrWrongType):
		return nil, msgWrongType
	case err != nil:
		return nil, "ERR " + err.Error()
	}
	if !writes {
		return apply(v, ops, nil), ""
	}
	// One copy of the value, grown with zero bytes, becomes the new value. It is not
	// touched after the Set, so it can back the stored string without a second copy
	// (the strings may be large: fleetlimit's windows are megabytes of counters).
	buf := make([]byte, max(uint64(len(v)), top/8+1))
	copy(buf, v)
	res := apply(buf, ops, buf)
	ttl := st.TTL(key) // Set drops it
	if err := st.Set(key, unsafe.String(unsafe.SliceData(buf), len(buf))); err != nil {
		if errors.Is(err, miniredis.ErrWrongType) {
			return nil, msgWrongType
		}
		return nil, "ERR " + err.Error()
	}
	if ttl > 0 {
		st.SetTTL(key, ttl)
	}
	return res, ""
}

// parse reads the subcommands after the key as Redis does, all of them before any
// runs: it returns the ops, whether any writes, the highest bit written, or the error
// reply of the first bad argument.
func parse(args []string) (ops []op, writes bool, top uint64, errMsg string) {
	ow := wrap
	for j := 0; j < len(args); j++ {
		rem := len(args) - j - 1
		var kind opKind
		switch sub := args[j]; {
		case strings.EqualFold(sub, "get") && rem >= 2:
			kind = opGet
		case strings.EqualFold(sub, "set") && rem >= 3:
			kind = opSet
		case strings.EqualFold(sub, "incrby") && rem >= 3:
			kind = opIncrBy
		case strings.EqualFold(sub, "overflow") && rem >= 1:
			j++
			switch t := args[j]; {
			case strings.EqualFold(t, "wrap"):
				ow = wrap
			case strings.EqualFold(t, "sat"):
				ow = sat
			case strings.EqualFold(t, "fail"):
				ow = fail
			default:
				return nil, false, 0, msgBadOverflow
			}
			continue
		default:
			return nil, false, 0, msgSyntax
		}
		signed, bits, ok := parseType(args[j+1])
		if !ok {
			return nil, false, 0, msgBadType
		}
		offset, ok := parseOffset(args[j+2], bits)
		if !ok {
			return nil, false, 0, msgBadOffset
		}
		o := op{kind: kind, signed: signed, bits: bits, offset: offset, ow: ow}
		if kind != opGet {
			writes = true
			top = max(top, offset+uint64(bits)-1)
			if o.value, ok = parseInt(args[j+3]); !ok {
				return nil, false, 0, msgBadValue
			}
			j++
		}
		ops = append(ops, o)
		j += 2
	}
	return ops, writes, top, ""
}

// parseType reads a type: 'i' or 'u' (lower case only) and a width, 1..64 for i and
// 1..63 for u.
func parseType(s string) (signed bool, bits uint, ok bool) {
	if s == "" || (s[0] != 'i' && s[0] != 'u') {
		return false, 0, false
	}
	n, ok := parseInt(s[1:])
	signed = s[0] == 'i'
	if !ok || n < 1 || n > 64 || (!signed && n > 63) {
		return false, 0, false
	}
	return signed, uint(n), true
}

// parseOffset reads a bit offset: a plain bit number, or '#' and a number of fields of
// bits bits. Like Redis it multiplies in 64 bits without an overflow check (so a huge
// '#' offset may wrap to a valid one) and then wants the offset's byte below 512 MB.
func parseOffset(s string, bits uint) (uint64, bool) {
	hash := strings.HasPrefix(s, "#")
	if hash {
		s = s[1:]
	}
	n, ok := parseInt(s)
	if !ok {
		return 0, false
	}
	if hash {
		n *= int64(bits)
	}
	if n < 0 || n>>3 >= maxBulkLen {
		return 0, false
	}
	return uint64(n), true
}

// parseInt reads a 64-bit integer as Redis's string2ll does: optional '-', no '+', no
// spaces, no leading zeros ("-0" is refused as well).
func parseInt(s string) (int64, bool) {
	if s == "0" {
		return 0, true
	}
	d := strings.TrimPrefix(s, "-")
	if d == "" || d[0] < '1' || d[0] > '9' {
		return 0, false
	}
	for i := 1; i < len(d); i++ {
		if d[i] < '0' || d[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

// apply runs ops on the value v; bits a GET reads past its end are zero. out is where
// SET and INCRBY write: v itself, grown to hold every bit they write, or nil when there
// are none.
func apply[T string | []byte](v T, ops []op, out []byte) []result {
	res := make([]result, len(ops))
	for i, o := range ops {
		raw := getBits(v, o.offset, o.bits)
		if o.kind == opGet {
			res[i].v = decode(raw, o)
			continue
		}
		var (
			nv  uint64 // the new field, in its low o.bits bits
			ovf bool
		)
		if o.signed {
			old := signExtend(raw, o.bits)
			var v int64
			if o.kind == opSet {
				v, ovf = signedSet(o.value, o.bits, o.ow)
				res[i].v = old
			} else {
				v, ovf = signedIncr(old, o.value, o.bits, o.ow)
				res[i].v = v
			}
			nv = uint64(v)
		} else {
			if o.kind == opSet {
				nv, ovf = unsignedSet(o.value, o.bits, o.ow)
				res[i].v = int64(raw)
			} else {
				nv, ovf = unsignedIncr(raw, o.value, o.bits, o.ow)
				res[i].v = int64(nv)
			}
		}
		if ovf && o.ow == fail {
			res[i] = result{nil: true}
			continue
		}
		setBits(out, o.offset, o.bits, nv)
	}
	return res
}

// decode turns the raw bits of a field into its value.
func decode(raw uint64, o op) int64 {
	if o.signed {
		return signExtend(raw, o.bits)
	}
	return int64(raw)
}

// signExtend reads the low bits bits of raw as a two's complement number.
func signExtend(raw uint64, bits uint) int64 {
	return int64(raw<<(64-bits)) >> (64 - bits)
}

// signedRange is the range of a signed field of bits bits.
func signedRange(bits uint) (lo, hi int64) {
	if bits == 64 {
		return math.MinInt64, math.MaxInt64
	}
	hi = int64(1)<<(bits-1) - 1
	return -hi - 1, hi
}

// signedSet is what SET stores in a signed field, and whether v overflows it.
func signedSet(v int64, bits uint, ow overflow) (int64, bool) {
	lo, hi := signedRange(bits)
	switch {
	case v > hi:
		if ow == sat {
			return hi, true
		}
		return signExtend(uint64(v), bits), true
	case v < lo:
		if ow == sat {
			return lo, true
		}
		return signExtend(uint64(v), bits), true
	}
	return v, false
}

// signedIncr is old+incr in a signed field, and whether the sum overflows it.
func signedIncr(old, incr int64, bits uint, ow overflow) (int64, bool) {
	lo, hi := signedRange(bits)
	var up, down bool
	if bits == 64 {
		sum := old + incr
		up = incr > 0 && sum < old
		down = incr < 0 && sum > old
	} else { // old is within [lo, hi], so hi-old and lo-old do not overflow
		up = incr > hi-old
		down = incr < lo-old
	}
	switch {
	case up && ow == sat:
		return hi, true
	case down && ow == sat:
		return lo, true
	}
	return signExtend(uint64(old)+uint64(incr), bits), up || down
}

// unsignedSet is what SET stores in an unsigned field, and whether v overflows it. As in
// Redis the value is taken as an unsigned 64-bit number, so a negative one overflows
// upwards: SAT stores the maximum, WRAP its low bits.
func unsignedSet(v int64, bits uint, ow overflow) (uint64, bool) {
	hi := uint64(1)<<bits - 1
	u := uint64(v)
	if u > hi {
		if ow == sat {
			return hi, true
		}
		return u & hi, true
	}
	return u, false
}

// unsignedIncr is old+incr in an unsigned field (0 to 2^bits-1), and whether the sum
// overflows it: SAT stops at the maximum or at 0, WRAP keeps the sum modulo 2^bits.
func unsignedIncr(old uint64, incr int64, bits uint, ow overflow) (uint64, bool) {
	hi := uint64(1)<<bits - 1
	// old <= hi < 2^63, so both differences fit an int64.
	up := incr > 0 && incr > int64(hi-old)
	down := incr < 0 && incr < -int64(old)
	switch {
	case up && ow == sat:
		return hi, true
	case down && ow == sat:
		return 0, true
	}
	return (old + uint64(incr)) & hi, up || down
}

// getBits reads bits bits at bit offset off of buf, bit 0 being the most significant bit
// of buf[0]; bits past the end of buf read as 0.
func getBits[T string | []byte](buf T, off uint64, bits uint) uint64 {
	var v uint64
	for i := uint64(0); i < uint64(bits); i++ {
		p := off + i
		v <<= 1
		if byteAt := p >> 3; byteAt < uint64(len(buf)) {
			v |= uint64(buf[byteAt]>>(7-p&7)) & 1
		}
	}
	return v
}

// setBits writes the low bits bits of v at bit offset off of buf, which must hold them.
func setBits(buf []byte, off uint64, bits uint, v uint64) {
	for i := uint64(0); i < uint64(bits); i++ {
		p := off + i
		bit := byte(v>>(uint64(bits)-1-i)) & 1
		mask := byte(1) << (7 - p&7)
		buf[p>>3] = buf[p>>3]&^mask | bit<<(7-p&7)
	}
}

// connState reads what miniredis keeps of a connection in its Peer's Ctx, an
// unexported *connCtx: the SELECTed database, whether the command comes from a Lua
// script (miniredis then holds its lock, so the direct API would deadlock), and whether
// a MULTI is open. known is false when Ctx is not laid out as in miniredis v2.40.0;
// the caller then uses the Miniredis's own selected database and cannot tell scripts
// or transactions. A Peer that has run no built-in command yet has no Ctx: database 0.
func connState(c *server.Peer) (db int, nested, inTx, known bool) {
	if c.Ctx == nil {
		return 0, false, false, true
	}
	v := reflect.ValueOf(c.Ctx)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return 0, false, false, false
	}
	s := v.Elem()
	sel, nest, tx := s.FieldByName("selectedDB"), s.FieldByName("nested"), s.FieldByName("transaction")
	if sel.Kind() != reflect.Int || nest.Kind() != reflect.Bool || tx.Kind() != reflect.Slice {
		return 0, false, false, false
	}
	return int(sel.Int()), nest.Bool(), !tx.IsNil(), true
}
