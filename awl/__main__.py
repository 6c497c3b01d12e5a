from awl.cli import main

raise SystemExit(main())
