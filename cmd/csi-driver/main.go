// Command csi-driver is the Cistern CSI plugin. See README.md.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "csi-driver: not implemented yet")
	os.Exit(1)
}
