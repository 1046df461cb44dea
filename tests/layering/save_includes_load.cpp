// Compiled against the save layer only: save and load are siblings that share
// nothing but the layers below them, so load's headers must not be found.
#include "load/checkpoint_reader.h"
