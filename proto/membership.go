package proto

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Configuration is a timeline's membership (README_PROTO.md, "Membership
// and generations"): its generation, the node ids of its members and,
// while the membership changes, the new members (a joint configuration:
// an election and a commit then need a majority of the members and a
// majority of the new members, counted apart).
//
// Generation 0 is no configuration: a timeline served by a fixed list of
// addresses, where a quorum is a majority of the safekeepers the proposer
// lists (what every timeline was before generations). A generation, once
// created (by compare-and-swap in the configuration store, package fleet),
// names exactly one configuration.
type Configuration struct {
	Generation uint64   `json:"generation"`
	Members    []uint64 `json:"members"`
	NewMembers []uint64 `json:"new_members,omitempty"`
}

// MaxMembers bounds the members and the new members of a configuration
// (each list), as decoded from the wire.
const MaxMembers = 16

// MaxGeneration bounds a configuration's generation, and MaxTerm a term
// an operator may raise a safekeeper to (term_bump): far above any a
// fleet reaches, and far enough below 2^64 that the next one (+1) never
// wraps to 0.
const (
	MaxGeneration = 1 << 62
	MaxTerm       = 1 << 62
)

// Validate checks what every configuration holds: generation 0 has no
// members; from generation 1 on there are members, and new members only
// beside them; ids are not 0, none twice in one list, at most MaxMembers.
func (c Configuration) Validate() error {
	if c.Generation == 0 {
		if len(c.Members) > 0 || len(c.NewMembers) > 0 {
			return errors.New("generation 0 (no configuration) lists members")
		}
		return nil
	}
	if c.Generation > MaxGeneration {
		return fmt.Errorf("generation %d is above %d", c.Generation, uint64(MaxGeneration))
	}
	if len(c.Members) == 0 {
		return fmt.Errorf("generation %d has no members", c.Generation)
	}
	for _, set := range [][]uint64{c.Members, c.NewMembers} {
		if len(set) > MaxMembers {
			return fmt.Errorf("%d members in one list, at most %d", len(set), MaxMembers)
		}
		for i, id := range set {
			if id == 0 {
				return errors.New("member id 0")
			}
			if slices.Contains(set[:i], id) {
				return fmt.Errorf("member %d listed twice", id)
			}
		}
	}
	return nil
}

// Joint reports whether c is a joint configuration (it has new members).
func (c Configuration) Joint() bool { return len(c.NewMembers) > 0 }

// IsMember reports whether node id is a member or a new member of c.
func (c Configuration) IsMember(id uint64) bool {
	return slices.Contains(c.Members, id) || slices.Contains(c.NewMembers, id)
}

// All is every node id c names: the members, then the new members not
// among them.
func (c Configuration) All() []uint64 {
	out := slices.Clone(c.Members)
	for _, id := range c.NewMembers {
		if !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out
}

// Groups are the sets of which an election or a commit needs a majority
// each: the members, and during a change the new members too. Nil for
// generation 0 (a majority of whatever the proposer lists).
func (c Configuration) Groups() [][]uint64 {
	if c.Generation == 0 {
		return nil
	}
	if c.Joint() {
		return [][]uint64{c.Members, c.NewMembers}
	}
	return [][]uint64{c.Members}
}

// Clone returns a copy that shares no memory with c.
func (c Configuration) Clone() Configuration {
	c.Members = slices.Clone(c.Members)
	c.NewMembers = slices.Clone(c.NewMembers)
	return c
}

// Equal reports whether c and o are the same configuration.
func (c Configuration) Equal(o Configuration) bool {
	return c.Generation == o.Generation && slices.Equal(c.Members, o.Members) && slices.Equal(c.NewMembers, o.NewMembers)
}

func (c Configuration) String() string {
	if c.Generation == 0 {
		return "no configuration (generation 0)"
	}
	s := fmt.Sprintf("generation %d, members %v", c.Generation, c.Members)
	if c.Joint() {
		s += fmt.Sprintf(", new members %v", c.NewMembers)
	}
	return s
}

// putConfiguration appends c: generation u64, n u32, n × id u64, m u32,
// m × id u64.
func putConfiguration(b []byte, c Configuration) []byte {
	b = putU64(b, c.Generation)
	for _, set := range [][]uint64{c.Members, c.NewMembers} {
		b = putU32(b, uint32(len(set)))
		for _, id := range set {
			b = putU64(b, id)
		}
	}
	return b
}

func (r *reader) configuration() Configuration {
	var c Configuration
	c.Generation = r.u64()
	for _, set := range []*[]uint64{&c.Members, &c.NewMembers} {
		n := r.u32()
		if r.err != nil {
			return Configuration{}
		}
		if n > MaxMembers {
			r.err = fmt.Errorf("%w: %s: %d members in one list, at most %d", ErrMalformed, r.what, n, MaxMembers)
			return Configuration{}
		}
		if n > 0 {
			*set = make([]uint64, n)
			for i := range *set {
				(*set)[i] = r.u64()
			}
		}
	}
	if r.err == nil {
		if err := c.Validate(); err != nil {
			r.err = fmt.Errorf("%w: %s: configuration: %v", ErrMalformed, r.what, err)
		}
	}
	return c
}

// ConfigurationDetail starts the Detail of a safekeeper's refusal for the
// timeline's configuration (SQLSTATE SK001, SK002, or 22023 for another
// configuration of the same generation): the rest is the configuration the
// safekeeper holds, as JSON (README_PROTO.md).
const ConfigurationDetail = "configuration: "

// ParseConfigurationDetail reads the configuration from such a Detail.
func ParseConfigurationDetail(detail string) (Configuration, error) {
	rest, ok := strings.CutPrefix(detail, ConfigurationDetail)
	if !ok {
		return Configuration{}, fmt.Errorf("%w: detail %q does not start with %q", ErrMalformed, detail, ConfigurationDetail)
	}
	var c Configuration
	if err := json.Unmarshal([]byte(rest), &c); err != nil {
		return Configuration{}, fmt.Errorf("%w: configuration in detail: %v", ErrMalformed, err)
	}
	if err := c.Validate(); err != nil {
		return Configuration{}, fmt.Errorf("%w: configuration in detail: %v", ErrMalformed, err)
	}
	return c, nil
}

// AppendConfiguration appends c as the wire carries it (README_PROTO.md):
// generation u64, n u32, n × member id u64, m u32, m × new member id u64.
func AppendConfiguration(b []byte, c Configuration) []byte { return putConfiguration(b, c) }

// DecodeConfiguration parses exactly one configuration as
// AppendConfiguration writes it, and validates it. Errors wrap ErrMalformed.
func DecodeConfiguration(b []byte) (Configuration, error) {
	r := &reader{b: b, what: "configuration"}
	c := r.configuration()
	if err := r.done(); err != nil {
		return Configuration{}, err
	}
	return c, nil
}
