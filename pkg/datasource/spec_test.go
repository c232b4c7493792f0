package datasource

import (
	"testing"

	"google.golang.org/grpc/codes"
)

func TestCredentialsFromSecrets(t *testing.T) {
	c, err := CredentialsFromSecrets(map[string]string{"accessKeyID": "a", "secretAccessKey": "s", "other": "x"})
	if err != nil || c.AccessKeyID != "a" || c.SecretAccessKey != "s" {
		t.Fatalf("got %+v, %v", c, err)
	}
	if c.String() == "a" || c.String() == "s" {
		t.Fatal("credentials leak into String")
	}
	if _, err := CredentialsFromSecrets(map[string]string{"accessKeyID": "a"}); Code(err) != codes.InvalidArgument {
		t.Fatalf("half a key pair: %v", err)
	}
}
