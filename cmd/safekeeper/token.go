package main

import (
	"fmt"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/safekeeper/safekeeper/proto"
	"github.com/safekeeper/safekeeper/server/auth"
)

// The commands that make the keys and tokens of package server/auth
// (docs/security.md).

func tokenCommand() *cli.Command {
	return &cli.Command{
		Name:            "token",
		Usage:           "make Ed25519 key pairs and the JWTs they sign (Neon's tenant and safekeeperdata scopes)",
		OnUsageError:    func(c *cli.Context, err error, _ bool) error { return usageError{err} },
		Subcommands:     []*cli.Command{tokenKeygenCommand(), tokenIssueCommand()},
		HideHelpCommand: true,
		Action: func(c *cli.Context) error {
			if c.Args().First() == "help" {
				return c.App.RunContext(c.Context, append([]string{c.App.Name, "help", "token"}, c.Args().Tail()...))
			}
			if c.NArg() > 0 {
				return usagef("unknown command \"token %s\"; 'safekeeper help token' lists its subcommands", c.Args().First())
			}
			return cli.ShowSubcommandHelp(c)
		},
	}
}

func tokenKeygenCommand() *cli.Command {
	return &cli.Command{
		Name:      "keygen",
		Usage:     "write a new Ed25519 key pair: the private key signs tokens, safekeepers get the public key",
		UsageText: "safekeeper token keygen --private-key FILE --public-key FILE [--json]",
		Description: "Writes the private key as PKCS#8 PEM (mode 0600) and the public key as PKIX PEM (mode 0644),\n" +
			"the formats of `openssl genpkey -algorithm ed25519` and `openssl pkey -pubout` that Neon uses.\n" +
			"Each file is fsynced and appears whole or not at all; an existing file is never overwritten.",
		OnUsageError: func(c *cli.Context, err error, _ bool) error { return usageError{err} },
		Before:       func(c *cli.Context) error { return requireFlags(c, "private-key", "public-key") },
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "private-key", Usage: "file to write the private key to; must not exist (required)"},
			&cli.StringFlag{Name: "public-key", Usage: "file to write the public key to; must not exist (required)"},
			&cli.BoolFlag{Name: "json", Usage: "print the two paths as JSON (otherwise nothing is printed)"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usagef("token keygen takes no arguments, got %q", c.Args().Slice())
			}
			priv, pub := c.String("private-key"), c.String("public-key")
			if priv == "" || pub == "" {
				return usagef("--private-key and --public-key must name files")
			}
			if err := auth.GenerateKeys(priv, pub); err != nil {
				return err
			}
			if c.Bool("json") {
				return writeJSONLine(c, map[string]string{"private_key": priv, "public_key": pub})
			}
			return nil
		},
	}
}

func tokenIssueCommand() *cli.Command {
	return &cli.Command{
		Name:      "issue",
		Usage:     "print a token signed with a private key (the token alone, on one line)",
		UsageText: "safekeeper token issue --private-key FILE --scope tenant|safekeeperdata [--tenant-id HEX] [--ttl 24h]",
		Description: "Scope tenant grants one tenant (--tenant-id required); scope safekeeperdata grants every\n" +
			"tenant and the admin endpoints (no --tenant-id). The token expires after --ttl; --ttl 0\n" +
			"makes one that never expires (only removing its public key from every safekeeper revokes it).",
		OnUsageError: func(c *cli.Context, err error, _ bool) error { return usageError{err} },
		Before:       func(c *cli.Context) error { return requireFlags(c, "private-key", "scope") },
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "private-key", Usage: "PEM file of the Ed25519 private key (token keygen --private-key) (required)"},
			&cli.StringFlag{Name: "scope", Usage: "tenant or safekeeperdata (required)"},
			&cli.StringFlag{Name: "tenant-id", Usage: "tenant id, 32 hex digits (required for --scope tenant, refused for safekeeperdata)"},
			&cli.DurationFlag{Name: "ttl", Value: 24 * time.Hour, Usage: "lifetime of the token, at least 1s; 0: never expires"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usagef("token issue takes no arguments, got %q", c.Args().Slice())
			}
			scope, err := auth.ParseScope(c.String("scope"))
			if err != nil {
				return usagef("--scope %q: want tenant or safekeeperdata", c.String("scope"))
			}
			var tenant *proto.ID
			switch {
			case scope == auth.ScopeTenant && c.String("tenant-id") == "":
				return usagef("--scope tenant needs --tenant-id")
			case scope == auth.ScopeSafekeeperData && c.String("tenant-id") != "":
				return usagef("--scope safekeeperdata grants every tenant; it takes no --tenant-id")
			case c.String("tenant-id") != "": // empty (SAFEKEEPER_TENANT_ID=) is none
				id, err := proto.ParseID(c.String("tenant-id"))
				if err != nil {
					return usagef("--tenant-id %q: want 32 hex digits", c.String("tenant-id"))
				}
				tenant = &id
			}
			ttl := c.Duration("ttl")
			if ttl < 0 || (ttl > 0 && ttl < time.Second) {
				return usagef("--ttl %v: want at least 1s, or 0 for a token that never expires", ttl)
			}
			priv, err := auth.LoadPrivateKey(c.String("private-key"))
			if err != nil {
				return err
			}
			tok, err := auth.Issue(priv, scope, tenant, ttl, time.Now())
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(c.App.Writer, tok)
			return err
		},
	}
}
