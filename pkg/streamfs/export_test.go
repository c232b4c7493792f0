package streamfs

// WholeRange is the size of the ranges a whole-object read asks for, for tests of small objects.
var WholeRange = &wholeRange
