package client

import (
	"context"
	"net"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// TestPrimaryShutdownEndsTheStreamInWords: a walsender whose server shuts
// down ends its stream with CommandComplete inside COPY mode; the
// proposer's error says the primary is shutting down, in words, with no Go
// type names (it logged "unexpected *pgproto3.CommandComplete").
func TestPrimaryShutdownEndsTheStreamInWords(t *testing.T) {
	client, server := net.Pipe()
	t.Cleanup(func() { client.Close(); server.Close() })
	pcfg, err := pgconn.ParseConfig("host=127.0.0.1 user=test sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	pg, err := pgconn.Construct(&pgconn.HijackedConn{Conn: client, Config: pcfg, ParameterStatuses: map[string]string{}, TxStatus: 'I'})
	if err != nil {
		t.Fatal(err)
	}
	u := &Replication{pg: pg}
	go func() {
		be := pgproto3.NewBackend(server, server)
		be.Send(&pgproto3.CommandComplete{CommandTag: []byte("COPY 0")})
		be.Send(&pgproto3.EmptyQueryResponse{})
		be.Flush()
	}()
	_, err = u.Recv(context.Background())
	if err == nil || !strings.Contains(err.Error(), "shutting down") || strings.Contains(err.Error(), "pgproto3") {
		t.Fatalf("recv at the primary's shutdown: %v; want it to say the primary is shutting down, without Go type names", err)
	}
	_, err = u.Recv(context.Background())
	if err == nil || strings.Contains(err.Error(), "pgproto3") || !strings.Contains(err.Error(), "EmptyQueryResponse") {
		t.Fatalf("recv of an unexpected message: %v; want its protocol name, without the Go package", err)
	}
}
