// Command storagepool-sidecar. See README.md.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "storagepool-sidecar: not implemented yet")
	os.Exit(1)
}
